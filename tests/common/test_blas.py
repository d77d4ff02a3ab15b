"""The CPU's BLAS: which one to preload, how the command line restarts with it, and what a process runs on."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from specbench.common import blas


@pytest.fixture
def library(tmp_path):
    path = tmp_path / "libopenblas.so.0"
    path.write_bytes(b"")
    return path


def test_the_choice_follows_specbench_blas(library, tmp_path, monkeypatch):
    monkeypatch.setattr(blas, "candidates", lambda: [tmp_path / "absent.so", library])
    if not sys.platform.startswith("linux"):
        assert blas.optimized_blas({}) is None
        return
    assert blas.optimized_blas({}) == library  # the first candidate installed
    assert blas.optimized_blas({blas.BLAS_ENV: "reference"}) is None
    assert blas.optimized_blas({blas.BLAS_ENV: str(library)}) == library
    with pytest.raises(FileNotFoundError, match="SPECBENCH_BLAS='/nowhere.so' is not a file"):
        blas.optimized_blas({blas.BLAS_ENV: "/nowhere.so"})
    monkeypatch.setattr(blas, "candidates", lambda: [tmp_path / "absent.so"])
    assert blas.optimized_blas({}) is None
    assert "apt-get install libopenblas0-pthread" in blas.how_to_get()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="LD_PRELOAD is Linux's")
def test_the_preload_goes_first_and_once(library):
    env = blas.preload_environment({blas.BLAS_ENV: str(library), "LD_PRELOAD": "/lib/other.so", "X": "1"})
    assert env == {blas.BLAS_ENV: str(library), "LD_PRELOAD": f"{library} /lib/other.so", "X": "1"}
    assert blas.preload_environment(env) is None  # already preloaded
    assert blas.preload_environment({blas.BLAS_ENV: "reference"}) is None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="LD_PRELOAD is Linux's")
def test_the_command_line_restarts_itself_with_the_library(library, monkeypatch):
    from specbench import cli

    started = []

    def execve(path, argv, env):
        started.append((path, argv, env))
        raise SystemExit(0)

    monkeypatch.setenv(blas.BLAS_ENV, str(library))
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    monkeypatch.setattr(os, "execve", execve)
    with pytest.raises(SystemExit):
        cli.main()
    assert started == [(sys.executable, sys.orig_argv, {**os.environ, "LD_PRELOAD": str(library)})]
    started.clear()
    with pytest.raises(SystemExit):  # arguments given (a library call): argparse's --version exit, no restart
        cli.main(["--version"])
    monkeypatch.setattr(sys, "argv", ["specbench", "--version"])
    monkeypatch.setenv("LD_PRELOAD", str(library))
    with pytest.raises(SystemExit):  # preloaded already: no restart
        cli.main()
    assert started == []


def test_this_process_names_its_blas():
    used = blas.blas_in_use()
    if sys.platform == "darwin":
        assert used == "Accelerate"
    elif "openblas" in os.environ.get("LD_PRELOAD", "").lower():
        assert used.startswith("OpenBLAS ") and used.endswith(" threads")
    elif not os.environ.get("LD_PRELOAD"):
        assert blas.is_reference(used), used  # MLX's vendored BLAS
    assert blas.status_line().startswith("CPU BLAS: ")


@pytest.mark.skipif(not any(p.is_file() for p in blas.candidates()), reason="no OpenBLAS installed here")
def test_a_preloaded_openblas_runs_mlx_matmuls():
    """A process started with ``preload_environment`` runs MLX's CPU matmuls on the installed OpenBLAS."""
    env = blas.preload_environment({k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", blas.BLAS_ENV)})
    assert env is not None
    code = (
        "import mlx.core as mx; from specbench.common.blas import blas_in_use; "
        "a = mx.ones((256, 256)); mx.eval(a @ a); print(blas_in_use())"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.startswith("OpenBLAS "), out.stdout + out.stderr


@pytest.mark.skipif(not any(p.is_file() for p in blas.candidates()), reason="no OpenBLAS installed here")
def test_a_process_on_the_reference_blas_says_so_once_where_openblas_is_installed():
    """The README's route (plain Python, no preload): loading a model warns once that MLX runs on its reference BLAS
    and how to load the installed one, and a verdict written there says it was measured on it; with the BLAS
    preloaded, or SPECBENCH_BLAS=reference, nothing is said."""
    code = (
        "import warnings; warnings.simplefilter('always')\n"
        "import specbench\n"
        "from specbench.report.outputs import reference_blas_note\n"
        "for _ in range(2): specbench.load('synthetic:qwen3-8b-tiny')\n"
        "print('NOTE' + reference_blas_note())"
    )
    plain = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", blas.BLAS_ENV)}
    for env, warned, noted in [
        (plain, True, True),
        (blas.preload_environment(plain), False, False),
        ({**plain, blas.BLAS_ENV: "reference"}, False, True),  # chosen: not warned, but its verdicts say so
    ]:
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        assert out.stderr.count("MLX runs on its reference BLAS here although") == int(warned), out.stderr
        assert ("reference BLAS" in out.stdout) == noted, out.stdout
