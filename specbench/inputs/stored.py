"""Reading back the files benchmarks and simulations wrote (results being resumed, recorded outputs): a damaged file
is a ValueError naming it and saying how to recover, not a parser's traceback."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def _damaged(path: Path, err: BaseException, remedy: str) -> ValueError:
    detail = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return ValueError(f"{path}: damaged or not a {path.suffix.lstrip('.') or 'data'} file ({detail}); {remedy}")


def read_parquet(path: str | os.PathLike, remedy: str = "delete it or write it again") -> Any:
    """A polars frame from ``path``; a missing file is a FileNotFoundError, a damaged one a ValueError."""
    import polars as pl

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no table at {path}")
    try:
        return pl.read_parquet(path)
    except (pl.exceptions.PolarsError, OSError) as err:
        raise _damaged(path, err, remedy) from None


def read_json(path: str | os.PathLike, remedy: str = "delete it or write it again") -> Any:
    """The JSON value in ``path``; a damaged file (bad JSON or not UTF-8) is a ValueError naming it."""
    path = Path(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as err:
        raise _damaged(path, err, remedy) from None
