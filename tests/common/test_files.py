"""Atomic writers: a file is written whole or not at all, and no temporary file is left."""

from __future__ import annotations

import csv
import json
import os
import stat

import mlx.core as mx
import numpy as np
import polars as pl
import pytest

from specbench.common import identity
from specbench.common.files import (
    DamagedFileWarning,
    check_writable,
    set_aside,
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
            target.write(b"half")
            raise OSError("disk full")

    with pytest.raises(OSError):
        write_parquet_atomic(Broken(), path)
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["t.txt"]


def test_a_full_disk_names_the_file_being_written(tmp_path, monkeypatch):
    """ENOSPC while writing: an OSError whose filename is the target (the CLI prints "No space left on device:
    PATH"), the old file kept and no temporary file left; polars' parquet writer included."""
    import errno
    from pathlib import Path

    from specbench.cli import error_line

    old = {"t.json": write_json_atomic(tmp_path / "t.json", {"old": 1}).read_text()}
    old["t.parquet"] = write_parquet_atomic(pl.DataFrame({"x": [1]}), tmp_path / "t.parquet").read_bytes()

    def full(self, data, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Path, "write_text", full)
    monkeypatch.setattr(Path, "write_bytes", full)
    for name, write in (
        ("t.json", lambda path: write_json_atomic(path, {"new": 2})),
        ("t.parquet", lambda path: write_parquet_atomic(pl.DataFrame({"x": [2]}), path)),
    ):
        with pytest.raises(OSError) as caught:
            write(tmp_path / name)
        assert caught.value.errno == errno.ENOSPC and caught.value.filename == str(tmp_path / name)
        assert error_line(caught.value) == f"No space left on device: {tmp_path / name}"
    monkeypatch.undo()
    assert (tmp_path / "t.json").read_text() == old["t.json"]
    assert (tmp_path / "t.parquet").read_bytes() == old["t.parquet"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.json", "t.parquet"]


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_atomic_writes_get_the_permissions_of_a_new_file(tmp_path, umask, mode):
    old = os.umask(umask)
    try:
        for path in (
            write_text_atomic(tmp_path / "t.txt", "x"),
            write_json_atomic(tmp_path / "t.json", {}),
            write_parquet_atomic(pl.DataFrame({"x": [1]}), tmp_path / "t.parquet"),
        ):
            assert stat.S_IMODE(path.stat().st_mode) == mode, path
    finally:
        os.umask(old)


def test_check_writable_makes_the_folder_and_rejects_what_cannot_be_written(tmp_path):
    assert check_writable(tmp_path / "new" / "log.parquet") == tmp_path / "new" / "log.parquet"
    assert (tmp_path / "new").is_dir() and list((tmp_path / "new").iterdir()) == []  # the probe is gone
    assert check_writable(tmp_path / "out", folder=True).is_dir()
    with pytest.raises(ValueError, match=r"--log: .* is a folder"):
        check_writable(tmp_path / "new", name="--log")
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="is a file, not a folder"):
        check_writable(tmp_path / "file", folder=True)
    with pytest.raises(OSError, match="cannot write to the folder"):
        check_writable(tmp_path / "file" / "log.parquet")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_check_writable_rejects_a_read_only_folder(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        with pytest.raises(PermissionError, match=f"cannot write to the folder {folder}"):
            check_writable(folder / "log.parquet")
    finally:
        folder.chmod(0o700)


def test_set_aside_moves_a_damaged_file_with_a_warning_naming_it(tmp_path):
    path = tmp_path / "p.json"
    for _ in range(2):  # twice within a second: two distinct names
        path.write_text("{")
        with pytest.warns(DamagedFileWarning, match=f"{path} is damaged \\(bad\\): moved aside to p.json.damaged-"):
            moved = set_aside(path, "thing", "bad")
        assert not path.exists() and moved.read_text() == "{"
    assert len(list(tmp_path.glob("p.json.damaged-*"))) == 2
    assert set_aside(path, "thing", "bad") is None  # gone already (moved by another process)


def test_kernel_key_names_device_versions_and_the_blas_library(monkeypatch):
    key = identity.kernel_key()
    assert identity.device_name() in key and f"mlx {mx.__version__}" in key
    if mx.default_device().type == mx.DeviceType.cpu:
        assert f"blas {identity.blas_library()}" in key
        monkeypatch.setattr(identity, "blas_in_use", lambda: "OtherBLAS 9.9, 3 threads")
        assert identity.kernel_key() != key and identity.kernel_key().endswith("blas OtherBLAS 9.9, 3 threads")
    else:
        assert identity.blas_library() is None and "blas" not in key


def test_finished_work_that_cannot_be_written_is_kept_elsewhere(tmp_path, capsys):
    import errno

    from specbench.common.files import write_or_keep, write_text_atomic

    wanted = tmp_path / "log.parquet"

    def write(path):
        if path == wanted:
            raise OSError(errno.ENOSPC, "No space left on device")
        write_text_atomic(path, "the work")

    kept = write_or_keep(wanted, write, "step log")
    assert kept != wanted and kept.read_text() == "the work" and kept.name.endswith("-log.parquet")
    said = capsys.readouterr().err
    assert f"could not write the step log to {wanted}" in said and f"kept in {kept}" in said

    def nowhere(path):
        raise OSError(errno.EROFS, "Read-only file system")

    with pytest.raises(OSError, match=f"cannot write the rows to {wanted}.*nor to"):
        write_or_keep(wanted, nowhere, "rows")
    kept.unlink()
