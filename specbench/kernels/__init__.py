"""Row-invariant kernels: products whose every row is computed as MLX computes that row alone.

``qmv_rows`` (CUDA, ``mx.fast.cuda_kernel``) is a w-row quantized matmul that reproduces MLX's
one-row ``qmv`` per row while reading the weights once; ``qmv_rows_reference`` is its arithmetic in
MLX ops. ``qmv_variant`` is the device probe that decides whether (and in which variant) the kernel
is used; exact verification (``specbench.exact``) uses it only where the probe proves it exact.
"""

from specbench.kernels.probe import cuda_available, probe_kernels, qmv_matches, qmv_variant, warn_fallback
from specbench.kernels.qmv import MAX_ROWS, qmv_rows, qmv_rows_reference, supports

__all__ = [
    "MAX_ROWS",
    "qmv_rows",
    "qmv_rows_reference",
    "supports",
    "cuda_available",
    "qmv_matches",
    "qmv_variant",
    "probe_kernels",
    "warn_fallback",
]
