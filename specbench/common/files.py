"""Where specbench keeps files, and files written whole or not at all (a temporary file beside the
target, then a rename)."""

from __future__ import annotations

import csv
import io
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlx.core as mx

#: The installed package folder, its bundled assets, and the project folder around it (a source checkout).
PACKAGE_DIR = Path(__file__).resolve().parents[1]
ASSETS_DIR = PACKAGE_DIR / "assets"
PROJECT_ROOT = PACKAGE_DIR.parent


def home() -> Path:
    """Where specbench keeps its files: ``$SPECBENCH_HOME`` or ``~/.cache/specbench``."""
    return Path(os.environ.get("SPECBENCH_HOME") or "~/.cache/specbench").expanduser()


def _write_atomic(path: str | os.PathLike, write: Callable[[str], Any], suffix: str = ".tmp") -> Path:
    """Call ``write(tmp)`` on a temporary file beside ``path`` (creating its folder), then rename
    it to ``path``; the temporary file is removed if ``write`` fails."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=suffix)
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` to ``path`` atomically (creating its folder); return the path."""
    return _write_atomic(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))


def write_parquet_atomic(frame, path: str | os.PathLike) -> Path:
    """Write a polars DataFrame as parquet atomically (creating its folder); return the path."""
    return _write_atomic(path, frame.write_parquet)


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
