"""What ranks exchange: data only (``specbench.common.wire``), and no code-executing deserialisation in the package."""

from __future__ import annotations

import ast
import math
from pathlib import Path

import mlx.core as mx
import numpy as np
import polars as pl
import pytest

from specbench.common import wire
from specbench.common.files import PACKAGE_DIR
from specbench.report.runner import NotebookResult

ROUND_TRIPS = [
    None,
    True,
    7,
    -2.5,
    "text ✓",
    [1, [2, "x"]],
    (1, (2, 3)),
    {"a", "b"},
    {3: "int key", (1, 2): "tuple key"},
    {"$wire": "a key that looks like a tag"},
    b"\x00\xffbytes",
    Path("/some/where"),
    NotebookResult("quickstart", "done", 1.5),
]


@pytest.mark.parametrize("value", ROUND_TRIPS, ids=lambda v: type(v).__name__)
def test_values_come_back_equal(value):
    assert wire.loads(wire.dumps(value)) == value


def test_arrays_frames_and_nan_come_back():
    value = {
        "bf16": mx.array([1.5, -2.0], dtype=mx.bfloat16),
        "np": np.arange(6, dtype=np.int16).reshape(2, 3),
        "frame": pl.DataFrame({"a": [1, 2], "b": ["x", None]}),
        "nan": float("nan"),
    }
    back = wire.loads(wire.dumps(value))
    assert back["bf16"].dtype == mx.bfloat16 and back["bf16"].tolist() == [1.5, -2.0]
    assert back["np"].dtype == np.int16 and back["np"].tolist() == [[0, 1, 2], [3, 4, 5]]
    assert back["frame"].equals(value["frame"])
    assert math.isnan(back["nan"])


class _NotData:
    pass


@pytest.mark.parametrize("value", [_NotData(), np.array([object()]), print, {1: _NotData()}])
def test_what_is_not_data_is_refused_when_sent(value):
    with pytest.raises(ValueError, match="cannot be sent between ranks"):
        wire.dumps(value)


@pytest.mark.parametrize(
    "received, said",
    [
        (b'{"$wire": "pickle", "v": ""}', "tagged 'pickle'"),
        (b'{"$wire": "dataclass", "type": "os:system", "v": {}}', "not one of specbench's"),
        (b'{"$wire": "dataclass", "type": "specbench.common.wire:dumps", "v": {}}', "not a dataclass"),
        (b'{"$wire": "dataclass", "type": "specbench.nothing.here:X", "v": {}}', "not one of specbench's"),
        (b'{"$wire": "np", "dtype": "O", "shape": [1], "v": ""}', "objects"),
        (b'{"$wire": "mx", "dtype": "eval", "array": []}', "unknown dtype"),
        (b'{"$wire": "tuple"}', "damaged"),
        (b"\xff\xfe", "damaged"),
    ],
)
def test_received_data_that_is_not_ours_is_refused(received, said):
    with pytest.raises(ValueError, match=said):
        wire.loads(received)


_CODE_LOADERS = {"pickle", "cPickle", "_pickle", "dill", "cloudpickle", "marshal", "shelve", "joblib", "eval", "exec"}


def test_no_code_executing_deserialisation_in_the_package():
    found = []
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name.split(".")[0] for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module.split(".")[0]]
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in {"eval", "exec"}:
                names = [node.func.id]
            elif isinstance(node, ast.Attribute) and ast.unparse(node) in {"yaml.load", "yaml.unsafe_load"}:
                names = ["yaml.load"]
            where = f"{path.relative_to(PACKAGE_DIR)}:{getattr(node, 'lineno', 0)}"
            found += [f"{where} {n}" for n in names if n in _CODE_LOADERS | {"yaml.load"}]
        assert "pickle" not in path.read_text(encoding="utf-8"), f"{path} mentions pickle"
    assert not found, found
