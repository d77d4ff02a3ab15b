"""What the CUDA kernels share about MLX's compilation of ``mx.fast.cuda_kernel`` sources."""

from __future__ import annotations

import hashlib


def kernel_name(base: str, *sources: str) -> str:
    """``base`` and a digest of the kernel's source texts, as the kernel's name.

    MLX keeps a compiled custom kernel on disk under its name and template arguments alone
    (``$MLX_PTX_CACHE_DIR``, by default ``<temporary folder>/mlx/<version>/ptx``) and loads it from there
    in later processes, so a kernel whose source changed under the same name would run its old machine code.
    """
    return f"{base}_{hashlib.sha1(''.join(sources).encode()).hexdigest()[:10]}"
