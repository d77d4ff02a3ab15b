"""The CPU's BLAS: which library MLX's CPU matmuls run on, and an optimized one to preload.

MLX's Linux CPU wheel links a vendored reference BLAS (netlib's): a float32 matmul runs at a few GFLOP/s,
so every forward wider than one row costs about as much per row as a decode step, unlike on any accelerator.
An optimized BLAS with the same interface, preloaded into the process (``LD_PRELOAD``), takes its place:
with Debian's OpenBLAS (``libopenblas0-pthread``) the same matmul runs 20-50x faster. The symbols of a
preloaded library come first in the process's lookup order, so MLX's calls resolve to it.
"""

from __future__ import annotations

import ctypes
import functools
import os
import re
import sys
import sysconfig
from collections.abc import Mapping
from pathlib import Path

#: The environment variable that picks the BLAS to preload: a path, or "reference" for MLX's own.
BLAS_ENV = "SPECBENCH_BLAS"
#: Shared libraries that provide BLAS to MLX's CPU kernels (an LD_PRELOADed OpenBLAS, MKL, BLIS, reference BLAS).
_BLAS_LIBRARY = re.compile(r"^lib(open)?blas|^libmkl|^libblis|^libflexiblas|^libacml|^libessl", re.IGNORECASE)


def candidates() -> list[Path]:
    """Where distributions install a threaded OpenBLAS with the standard BLAS interface, most common first:
    Debian and Ubuntu (``libopenblas0-pthread``, ``libopenblas0-openmp``), Fedora (``openblas-threads``),
    Arch (``openblas``)."""
    multiarch = sysconfig.get_config_var("MULTIARCH") or f"{os.uname().machine}-linux-gnu"
    debian = Path("/usr/lib") / multiarch
    return [
        debian / "openblas-pthread" / "libblas.so.3",
        debian / "openblas-openmp" / "libblas.so.3",
        Path("/usr/lib64/libopenblasp.so.0"),
        Path("/usr/lib/libopenblas.so.0"),
    ]


def how_to_get() -> str:
    """What to install for an optimized BLAS on this system, in one sentence."""
    return (
        "install an optimized BLAS for 20-50x faster CPU matmuls: `apt-get install libopenblas0-pthread` "
        "(Debian, Ubuntu), `dnf install openblas-threads` (Fedora) or `pacman -S openblas` (Arch); "
        f"specbench preloads it from then on (or set {BLAS_ENV} to a BLAS library's path)"
    )


def optimized_blas(environ: Mapping[str, str] | None = None) -> Path | None:
    """The BLAS library to preload: ``SPECBENCH_BLAS``'s path, else the first of ``candidates()`` present;
    None on macOS (MLX uses Accelerate), with ``SPECBENCH_BLAS=reference``, or when none is installed.
    A ``SPECBENCH_BLAS`` path that does not exist is an error (a typo should not fall back in silence)."""
    env = os.environ if environ is None else environ
    choice = env.get(BLAS_ENV, "").strip()
    if not sys.platform.startswith("linux") or choice.lower() == "reference":
        return None
    if choice:
        path = Path(choice).expanduser()
        if not path.is_file():
            raise FileNotFoundError(f"{BLAS_ENV}={choice!r} is not a file (a BLAS library's path, or 'reference')")
        return path
    return next((path for path in candidates() if path.is_file()), None)


def preload_environment(environ: Mapping[str, str] | None = None) -> dict[str, str] | None:
    """``environ`` (default: this process's) with the optimized BLAS added to ``LD_PRELOAD``; None when
    there is nothing to add (none found, opted out, or already preloaded)."""
    env = dict(os.environ if environ is None else environ)
    library = optimized_blas(env)
    preloaded = env.get("LD_PRELOAD", "").replace(":", " ").split()
    if library is None or str(library) in preloaded:
        return None
    env["LD_PRELOAD"] = " ".join([str(library), *preloaded])
    return env


def _dladdr_file(address: int) -> str | None:
    """The file of the shared library holding ``address`` (glibc's ``dladdr``)."""

    class DlInfo(ctypes.Structure):
        _fields_ = [
            ("fname", ctypes.c_char_p),
            ("fbase", ctypes.c_void_p),
            ("sname", ctypes.c_char_p),
            ("saddr", ctypes.c_void_p),
        ]

    try:
        libc = ctypes.CDLL(None)
        info = DlInfo()
        if libc.dladdr(ctypes.c_void_p(address), ctypes.byref(info)) and info.fname:
            return info.fname.decode(errors="replace")
    except (OSError, AttributeError):
        pass
    return None


def _global_blas() -> str | None:
    """The BLAS that the process's global symbol scope provides (a preloaded library, which MLX's calls
    resolve to first): "OpenBLAS 0.3.21, 2 threads", or the library's file name; None when there is none
    (MLX's vendored BLAS is loaded locally, out of that scope)."""
    try:
        scope = ctypes.CDLL(None)
        sgemm = scope.cblas_sgemm
    except (OSError, AttributeError):
        return None
    if hasattr(scope, "openblas_get_config"):
        scope.openblas_get_config.restype = ctypes.c_char_p
        release = " ".join(scope.openblas_get_config().decode(errors="replace").split()[:2])
        return f"{release}, {int(scope.openblas_get_num_threads())} threads"
    path = _dladdr_file(ctypes.cast(sgemm, ctypes.c_void_p).value or 0)
    return Path(path).name if path else "a preloaded BLAS"


def _mapped_blas() -> str:
    """The BLAS libraries mapped into this process (``/proc/self/maps``), their file names joined by "+"."""
    try:
        lines = Path("/proc/self/maps").read_text().splitlines()
    except OSError:
        return "unknown"
    names = {Path(line.split(maxsplit=5)[-1]).name for line in lines if len(line.split(maxsplit=5)) == 6}
    return "+".join(sorted(n for n in names if _BLAS_LIBRARY.search(n))) or "none"


@functools.cache
def blas_in_use() -> str:
    """The BLAS MLX's CPU kernels run on, as text for keys and reports: "Accelerate" on macOS, a preloaded
    library ("OpenBLAS 0.3.21, 2 threads"), else the mapped BLAS libraries' file names (MLX's reference
    BLAS: ``libblas-bd8a282c.so.3.10.0``). Read once per process, after MLX is loaded."""
    if sys.platform == "darwin":
        return "Accelerate"
    return _global_blas() or _mapped_blas()


def is_reference(blas: str) -> bool:
    """Whether ``blas`` (a ``blas_in_use`` text) is MLX's vendored reference BLAS."""
    return blas.startswith("libblas-") and "+" not in blas


def status_line() -> str:
    """One line on the BLAS this process runs on, and how to get an optimized one where it runs on MLX's
    reference BLAS (for ``specbench setup`` and the report)."""
    blas = blas_in_use()
    if not sys.platform.startswith("linux") or not is_reference(blas):
        return f"CPU BLAS: {blas}"
    try:
        library = optimized_blas()
    except FileNotFoundError as err:
        return f"CPU BLAS: MLX's reference BLAS ({blas}): {err}"
    if os.environ.get(BLAS_ENV, "").strip().lower() == "reference":
        return f"CPU BLAS: MLX's reference BLAS ({blas}), as {BLAS_ENV}=reference asks"
    if library is not None:
        return (
            f"CPU BLAS: MLX's reference BLAS ({blas}); {library} is installed: `specbench` preloads it, "
            f"elsewhere start Python with LD_PRELOAD={library}"
        )
    return f"CPU BLAS: MLX's reference BLAS ({blas}): {how_to_get()}"


@functools.cache
def unloaded_warning() -> str | None:
    """Where MLX's CPU runs on its reference BLAS although an optimized one is installed (this process was not started
    by ``specbench``, ``make`` or the "specbench" Jupyter kernel, which preload it): one line saying so and how to
    load it, for a warning given once; None elsewhere (a GPU, macOS, a preloaded BLAS, ``SPECBENCH_BLAS=reference``)."""
    import mlx.core as mx

    if mx.default_device().type == mx.DeviceType.gpu or not is_reference(blas_in_use()):
        return None
    try:
        library = optimized_blas()  # None off Linux, with SPECBENCH_BLAS=reference, or where none is installed
    except FileNotFoundError:
        return None
    if library is None:
        return None
    return (
        f"MLX runs on its reference BLAS here although {library} is installed: timings differ from the report's "
        f"and the command line's; start Python with LD_PRELOAD={library}, choose the Jupyter kernel "
        f"'Python (specbench)', or set {BLAS_ENV}=reference to keep MLX's own"
    )


@functools.cache
def warn_if_unloaded() -> None:
    """Warn once per process (the call is cached) where ``unloaded_warning`` has something to say."""
    import warnings

    text = unloaded_warning()
    if text:
        warnings.warn(text, BlasWarning, stacklevel=3)


class BlasWarning(UserWarning):
    """MLX runs on its reference BLAS while an optimized one is installed."""
