"""Atomic writers: a file is written whole or not at all, and no temporary file is left."""

from __future__ import annotations

import csv
import json

import mlx.core as mx
import numpy as np
import polars as pl
import pytest

from specbench.common.files import (
    write_csv_atomic,
    write_json_atomic,
    write_parquet_atomic,
    write_safetensors_atomic,
    write_text_atomic,
)


def test_writers_round_trip_and_leave_no_temporary_files(tmp_path):
    rows = [{"a": 1, "b": [1, 2]}, {"a": 2, "c": "x"}]
    write_csv_atomic(tmp_path / "sub" / "t.csv", rows)
    read = list(csv.DictReader((tmp_path / "sub" / "t.csv").open()))
    assert read == [{"a": "1", "b": "[1, 2]", "c": ""}, {"a": "2", "b": "", "c": "x"}]
    assert write_csv_atomic(tmp_path / "empty.csv", []) is None and not (tmp_path / "empty.csv").exists()
    write_json_atomic(tmp_path / "t.json", {"p": tmp_path, "x": mx.array(1.5), "n": np.float32(2.5)})
    assert json.loads((tmp_path / "t.json").read_text()) == {"p": str(tmp_path), "x": 1.5, "n": 2.5}
    write_parquet_atomic(pl.DataFrame({"x": [1, 2]}), tmp_path / "t.parquet")
    assert pl.read_parquet(tmp_path / "t.parquet")["x"].to_list() == [1, 2]
    write_safetensors_atomic(tmp_path / "w.safetensors", {"w": mx.arange(3)}, metadata={"format": "mlx"})
    assert mx.load(str(tmp_path / "w.safetensors"))["w"].tolist() == [0, 1, 2]
    names = sorted(p.name for p in tmp_path.rglob("*") if p.is_file())
    assert names == ["t.csv", "t.json", "t.parquet", "w.safetensors"]


def test_a_failed_write_keeps_the_old_file(tmp_path):
    path = write_text_atomic(tmp_path / "t.txt", "old")

    class Broken:
        def write_parquet(self, target):
            open(target, "w").write("half")
            raise OSError("disk full")

    with pytest.raises(OSError):
        write_parquet_atomic(Broken(), path)
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["t.txt"]
