"""Where specbench keeps files, and files written whole or not at all (a temporary file beside the
target, then a rename)."""

from __future__ import annotations

import contextlib
import csv
import datetime as dt
import fcntl
import hashlib
import io
import json
import os
import re
import sys
import tempfile
import threading
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import mlx.core as mx

from specbench.common import distributed

#: The installed package folder, its bundled assets, and the project folder around it (a source checkout).
PACKAGE_DIR = Path(__file__).resolve().parents[1]
ASSETS_DIR = PACKAGE_DIR / "assets"
PROJECT_ROOT = PACKAGE_DIR.parent

T = TypeVar("T")


def home() -> Path:
    """Where specbench keeps its files: ``$SPECBENCH_HOME`` or ``~/.cache/specbench``."""
    return Path(os.environ.get("SPECBENCH_HOME") or "~/.cache/specbench").expanduser()


def _umask() -> int:
    """This process's umask (read without changing it where /proc tells it)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _write_atomic(path: str | os.PathLike, write: Callable[[str], Any], suffix: str = ".tmp") -> Path:
    """Call ``write(tmp)`` on a temporary file beside ``path`` (creating its folder), then rename
    it to ``path`` with the permissions a new file gets (0o666 less the umask); the temporary file
    is removed if ``write`` fails. A rank in lockstep with rank 0 (a sharded model) writes nothing:
    rank 0 writes the same file (``specbench.common.distributed.writes_here``)."""
    path = Path(path)
    if not distributed.writes_here():
        return path
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=suffix)
        os.close(fd)
        write(tmp)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except OSError as err:
        raise _naming(err, path, tmp) from err
    finally:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
    return path


def _naming(err: OSError, path: Path, tmp: str | None) -> OSError:
    """``err`` naming ``path`` (the file being written) where it names no file or only the temporary one:
    a full disk says "No space left on device: PATH", not just "No space left on device"."""
    if err.filename is not None and err.filename != tmp:
        return err
    if err.errno is None:
        return OSError(f"{err}: {path}")
    return OSError(err.errno, err.strerror or os.strerror(err.errno), str(path))


_LOCK = threading.RLock()


@contextlib.contextmanager
def locked(path: str | os.PathLike) -> Iterator[None]:
    """Hold an exclusive lock on ``<path>.lock`` (threads and processes alike) while inside: every stored
    file that is read, merged and written again is, under this lock, so that no writer loses another's part."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with _LOCK, open(path.with_name(path.name + ".lock"), "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def check_writable(path: str | os.PathLike, folder: bool = False, name: str | None = None) -> Path:
    """Check, before any work, that a file (or with ``folder``, a folder) can be written at ``path``:
    its folder is created and a probe file written there and removed. Raises a ValueError when the
    path is a folder where a file is wanted (or a file where a folder is), an OSError naming the
    folder when it cannot be made or written. ``name`` (e.g. "--log") prefixes the message."""
    path = Path(path).expanduser()
    prefix = f"{name}: " if name else ""
    if folder and path.exists() and not path.is_dir():
        raise ValueError(f"{prefix}{path} is a file, not a folder")
    if not folder and path.is_dir():
        raise ValueError(f"{prefix}{path} is a folder: give a file name")
    where = path if folder else path.parent
    try:
        where.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=where, prefix=".specbench-write-check.")
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        reason = err.strerror or str(err)
        raise type(err)(err.errno, f"{prefix}cannot write to the folder {where} ({reason})") from None
    return path


_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def safe_name(text: str, max_length: int = 100) -> str:
    """A file name made from ``text`` (a trace id, a model name) that stays in its folder: letters, digits,
    ``.``, ``-`` and ``_`` are kept, other runs become ``_`` and leading dots go; when anything changed,
    a digest of ``text`` is appended, so different texts keep different names."""
    text = str(text)
    name = _UNSAFE.sub("_", text).lstrip(".")[:max_length] or "_"
    if name == text:
        return name
    return f"{name}-{hashlib.sha1(text.encode('utf-8', 'surrogatepass')).hexdigest()[:8]}"


def inside(folder: str | os.PathLike, relative: str | os.PathLike, what: str = "path") -> Path:
    """``folder / relative`` when it stays inside ``folder`` (``..`` and links resolved); a ValueError
    naming ``what`` and the path otherwise."""
    base = Path(folder).resolve()
    path = (base / relative).resolve()
    if Path(relative).is_absolute() or not path.is_relative_to(base) or path == base:
        raise ValueError(f"{what} {str(relative)!r} leads outside its folder {base}: give a name inside it")
    return path


def write_or_keep(path: str | os.PathLike, write: Callable[[Path], Any], what: str = "output") -> Path:
    """``write(path)`` for finished work; when that fails (a full disk, a folder made read-only meanwhile),
    the work is written under the temporary folder instead, with a message on stderr saying where. Returns
    the path written; raises the first error, naming both paths, when neither can be written."""
    path = Path(path)
    try:
        write(path)
        return path
    except Exception as err:
        stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        elsewhere = Path(tempfile.gettempdir()) / "specbench-kept" / f"{stamp}-{path.name}"
        try:
            write(elsewhere)
        except Exception:
            raise OSError(f"cannot write the {what} to {path} ({err}) nor to {elsewhere}") from err
        print(f"specbench: could not write the {what} to {path} ({err}): kept in {elsewhere}", file=sys.stderr)
        return elsewhere


class DamagedFileWarning(UserWarning):
    """A stored file could not be read: it was moved aside (and is rebuilt where that applies)."""


def set_aside(path: str | os.PathLike, what: str, reason: BaseException | str, problem: str = "damaged") -> Path | None:
    """Move a damaged ``path`` aside to ``<name>.damaged-<timestamp>`` with a warning naming both
    files (``problem``: what is wrong with it, "damaged" or e.g. "foreign"); returns the new path (None if the
    file was gone already, e.g. moved by another process)."""
    path = Path(path)
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    target = path.with_name(f"{path.name}.damaged-{stamp}")
    n = 1
    while target.exists():
        n += 1
        target = path.with_name(f"{path.name}.damaged-{stamp}-{n}")
    try:
        os.replace(path, target)
        done: Path | None = target
        outcome = f": moved aside to {target.name}, to be made anew"
    except FileNotFoundError:
        return None
    except OSError as err:
        done, outcome = None, f" and could not be moved aside ({err})"
    warnings.warn(f"the {what} {path} is {problem} ({reason}){outcome}", DamagedFileWarning, stacklevel=2)
    return done


def read_or_set_aside(path: Path, read: Callable[[Path], T], what: str) -> T | None:
    """``read(path)``; None where there is no file, or where ``read`` raises a ValueError (the file is then moved
    aside with a warning naming it and the ``what``, to be made anew)."""
    if not path.exists():
        return None
    try:
        return read(path)
    except ValueError as err:
        set_aside(path, what, err.__cause__ or err)
        return None


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` to ``path`` atomically (creating its folder); return the path."""
    return _write_atomic(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))


def write_bytes_atomic(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (creating its folder); return the path."""
    return _write_atomic(path, lambda tmp: Path(tmp).write_bytes(data))


def write_parquet_atomic(frame, path: str | os.PathLike) -> Path:
    """Write a polars DataFrame as parquet atomically (creating its folder); return the path. The parquet is
    built in memory and then written, so that a full disk is an OSError naming the file (polars would raise
    its own error naming none)."""
    buffer = io.BytesIO()
    frame.write_parquet(buffer)
    return write_bytes_atomic(path, buffer.getvalue())


def write_csv_atomic(path: str | os.PathLike, rows: list[dict]) -> Path | None:
    """Write dict rows as CSV atomically, one column per key seen in any row (lists as JSON);
    nothing is written for no rows."""
    if not rows:
        return None
    keys = list(dict.fromkeys(k for r in rows for k in r))
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=keys)
    writer.writeheader()
    writer.writerows([{k: json.dumps(v) if isinstance(v, list) else v for k, v in r.items()} for r in rows])
    return write_text_atomic(path, buffer.getvalue())


def _json_value(value: Any) -> Any:
    """What JSON holds for a value it has no type for: numbers (NumPy, MLX scalars) as numbers,
    anything else as its text."""
    try:
        return value.item() if hasattr(value, "item") else str(value)
    except (TypeError, ValueError):
        return str(value)


def write_json_atomic(path: str | os.PathLike, data: Any) -> Path:
    """Write ``data`` as indented JSON atomically (NumPy and MLX scalars as numbers, other values
    JSON cannot hold as their text)."""
    return write_text_atomic(path, json.dumps(data, indent=1, default=_json_value))


def write_safetensors_atomic(
    path: str | os.PathLike, tensors: dict[str, mx.array], metadata: dict[str, str] | None = None
) -> Path:
    """Write mlx arrays as a safetensors file atomically (creating its folder); return the path."""
    return _write_atomic(path, lambda tmp: mx.save_safetensors(tmp, tensors, metadata=metadata), suffix=".safetensors")


def write_figure_atomic(fig: Any, path: str | os.PathLike, dpi: int = 130) -> Path:
    """Save a matplotlib figure atomically; the format follows the suffix (PNG without one)."""
    suffix = Path(path).suffix or ".png"
    return _write_atomic(path, lambda tmp: fig.savefig(tmp, dpi=dpi, format=suffix[1:]), suffix=suffix)
