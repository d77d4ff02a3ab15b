"""Row-invariant kernels: products whose every row is computed as MLX computes that row alone.

``qmv_rows`` (CUDA, ``mx.fast.cuda_kernel``; on Metal ``specbench.kernels.qmv_metal`` through
``mx.fast.metal_kernel``) is a w-row quantized matmul that reproduces MLX's one-row ``qmv`` per row while
reading the weights once, ``gemv_rows`` the same for unquantized
weights (MLX's one-row ``gemv``); each ``*_reference`` is its kernel's arithmetic in MLX ops.
``qmv_variant`` and ``gemv_variant`` are the device probes that decide whether (and in which variant)
a kernel is used; exact verification (``specbench.exact``) uses it only where the probe proves it exact.
A probe's verdict is stored per device, MLX version and kernel source (``specbench.kernels.verdicts``),
so it runs once, not in every process.

``attention_rows`` (CUDA) is attention of up to 16 query rows of a causal block over the KV cache whose
every row is MLX's one-query attention over the keys it attends, with each K/V load shared by the rows
and the query heads of a KV head; ``attention_rows_reference`` is its arithmetic in MLX ops and
``attention_variant`` its probe.
"""

from specbench.kernels.attention import attention_rows
from specbench.kernels.attention_reference import attention_rows_reference
from specbench.kernels.gemv import gemv_rows, gemv_rows_reference
from specbench.kernels.gemv import supports as gemv_supports
from specbench.kernels.probe import (
    attention_matches,
    attention_variant,
    cuda_available,
    gemv_matches,
    gemv_variant,
    qmv_matches,
    qmv_variant,
    warn_fallback,
)
from specbench.kernels.qmv import MAX_ROWS, QmvLauncher, launcher, qmv_rows, qmv_rows_reference, supports
from specbench.kernels.qmv_metal import MetalQmvLauncher, metal_available, qmv_rows_metal_reference
from specbench.kernels.verdicts import source_digest

__all__ = [
    "MAX_ROWS",
    "gemv_rows",
    "gemv_rows_reference",
    "gemv_supports",
    "gemv_matches",
    "gemv_variant",
    "qmv_rows",
    "QmvLauncher",
    "launcher",
    "MetalQmvLauncher",
    "metal_available",
    "qmv_rows_metal_reference",
    "qmv_rows_reference",
    "supports",
    "cuda_available",
    "qmv_matches",
    "qmv_variant",
    "warn_fallback",
    "attention_rows",
    "attention_rows_reference",
    "attention_matches",
    "attention_variant",
    "source_digest",
]
