"""Values as JSON bytes and back, for what ranks send each other: data only, nothing that runs code
when read. JSON's own types travel as themselves; tuples, sets, dicts with keys other than text,
bytes, paths, NumPy and MLX arrays, polars frames (Arrow IPC) and the package's own dataclasses
travel tagged. A dataclass is rebuilt only when its class is one of specbench's, already imported,
from its fields; any other tag or type is refused with a ValueError."""

from __future__ import annotations

import base64
import dataclasses
import io
import json
import sys
from pathlib import Path, PurePath
from typing import Any

import mlx.core as mx
import numpy as np

_TAG = "$wire"


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _encode(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, list):
        return [_encode(v) for v in value]
    if isinstance(value, tuple):
        return {_TAG: "tuple", "v": [_encode(v) for v in value]}
    if isinstance(value, (set, frozenset)):
        return {_TAG: "set", "v": [_encode(v) for v in value]}
    if isinstance(value, dict):
        if all(isinstance(k, str) for k in value) and _TAG not in value:
            return {k: _encode(v) for k, v in value.items()}
        return {_TAG: "dict", "v": [[_encode(k), _encode(v)] for k, v in value.items()]}
    if isinstance(value, (bytes, bytearray)):
        return {_TAG: "bytes", "v": _b64(bytes(value))}
    if isinstance(value, PurePath):
        return {_TAG: "path", "v": str(value)}
    if isinstance(value, mx.array):
        dtype = str(value.dtype).split(".")[-1]
        data = np.array(value.astype(mx.float32) if value.dtype == mx.bfloat16 else value)
        return {_TAG: "mx", "dtype": dtype, "array": _encode(data)}
    if isinstance(value, np.ndarray):
        if value.dtype.hasobject:
            raise ValueError("a NumPy array of Python objects cannot be sent between ranks")
        data = np.ascontiguousarray(value)
        return {_TAG: "np", "dtype": data.dtype.str, "shape": list(data.shape), "v": _b64(data.tobytes())}
    if isinstance(value, np.generic):
        return _encode(value.item())
    if type(value).__module__.split(".")[0] == "polars" and type(value).__name__ == "DataFrame":
        buffer = io.BytesIO()
        value.write_ipc(buffer)
        return {_TAG: "polars", "v": _b64(buffer.getvalue())}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        cls = type(value)
        fields = {f.name: _encode(getattr(value, f.name)) for f in dataclasses.fields(value)}
        return {_TAG: "dataclass", "type": f"{cls.__module__}:{cls.__qualname__}", "v": fields}
    raise ValueError(f"a {type(value).__name__} cannot be sent between ranks (data only: JSON types, arrays, frames)")


def _dataclass_type(name: str) -> type:
    """The dataclass ``module:qualname`` of the package, from a module already imported (nothing is imported)."""
    module_name, _, qualname = str(name).partition(":")
    module = sys.modules.get(module_name)
    if module is None or module_name.split(".")[0] != "specbench":
        raise ValueError(f"a value of type {name!r} was received: not one of specbench's loaded classes")
    cls: Any = module
    for part in qualname.split("."):
        cls = getattr(cls, part, None)
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
        raise ValueError(f"a value of type {name!r} was received: not a dataclass of specbench")
    return cls


def _decode(value: Any) -> Any:
    if isinstance(value, list):
        return [_decode(v) for v in value]
    if not isinstance(value, dict):
        return value
    tag = value.get(_TAG)
    if tag is None:
        return {k: _decode(v) for k, v in value.items()}
    if tag == "tuple":
        return tuple(_decode(v) for v in value["v"])
    if tag == "set":
        return {_decode(v) for v in value["v"]}
    if tag == "dict":
        return {_decode(k): _decode(v) for k, v in value["v"]}
    if tag == "bytes":
        return base64.b64decode(value["v"])
    if tag == "path":
        return Path(value["v"])
    if tag == "np":
        dtype = np.dtype(str(value["dtype"]))
        if dtype.hasobject:
            raise ValueError("a NumPy array of Python objects was received")
        data = np.frombuffer(base64.b64decode(value["v"]), dtype=dtype)
        return data.reshape([int(n) for n in value["shape"]]).copy()
    if tag == "mx":
        dtype = getattr(mx, str(value["dtype"]), None)
        if not isinstance(dtype, mx.Dtype):
            raise ValueError(f"an MLX array of unknown dtype {value['dtype']!r} was received")
        return mx.array(_decode(value["array"])).astype(dtype)
    if tag == "polars":
        import polars as pl

        return pl.read_ipc(io.BytesIO(base64.b64decode(value["v"])))
    if tag == "dataclass":
        cls = _dataclass_type(value["type"])
        fields = {k: _decode(v) for k, v in value["v"].items()}
        by_init = {f.name for f in dataclasses.fields(cls) if f.init}
        made = cls(**{k: v for k, v in fields.items() if k in by_init})
        for k, v in fields.items():
            if k not in by_init:
                object.__setattr__(made, k, v)
        return made
    raise ValueError(f"a value tagged {tag!r} was received: not one this version sends")


def dumps(value: Any) -> bytes:
    """``value`` as UTF-8 JSON bytes; a ValueError naming a type that cannot travel."""
    return json.dumps(_encode(value), separators=(",", ":")).encode("utf-8")


def loads(data: bytes) -> Any:
    """The value ``dumps`` made of ``data``; a ValueError for anything else (nothing is run)."""
    try:
        return _decode(json.loads(data.decode("utf-8")))
    except (KeyError, TypeError, AttributeError, UnicodeDecodeError) as err:
        raise ValueError(f"damaged data received from another rank ({type(err).__name__}: {err})") from None
