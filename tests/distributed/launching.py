"""Starting local ranks of the ring backend, as ``mlx.launch -n 2 --backend ring`` starts them (its
variables, set here directly: the launcher's own loop would take a core of this small machine), or a
skip saying why they cannot start."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from specbench.common.distributed import free_ports, local_ring_env

HERE = Path(__file__).resolve().parent


def launch_ranks(script: Path, out: Path, *args: str, ranks: int = 2, timeout: float = 300) -> None:
    """Run ``script OUT ARGS`` on ``ranks`` local ring ranks; each rank's script writes ``OUT/started<R>``
    first. Skips the test when the ranks cannot start here; fails when a started rank fails."""
    out.mkdir(parents=True, exist_ok=True)
    envs = local_ring_env(ranks, free_ports(ranks), out)
    procs = []
    for r, rank_env in enumerate(envs):
        env = {**os.environ, **rank_env, "PYTHONUNBUFFERED": "1"}
        with open(out / f"rank{r}.log", "w") as log:
            command = [sys.executable, str(script), str(out), *args]
            procs.append(subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT))
    try:
        codes = [proc.wait(timeout=timeout) for proc in procs]
    except subprocess.TimeoutExpired as err:
        for proc in procs:
            proc.kill()
        where = "; ".join(f"rank {r} {_stopped_at(out / f'rank{r}.log')}" for r in range(ranks))
        stopped = f"{script.name} on {ranks} ranks took over {timeout:.0f} s (a deadlock?): {where}"
        raise AssertionError(stopped) from err
    logs = "\n".join((out / f"rank{r}.log").read_text()[-3000:] for r in range(ranks))
    if any(codes) and not all((out / f"started{r}").exists() for r in range(ranks)):
        pytest.skip(f"{ranks} local ring ranks could not start here: {logs[-500:]}")
    assert not any(codes), logs


def _stopped_at(log: Path) -> str:
    """Where a rank's log stops: its last line, or that it wrote none."""
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()] if log.exists() else []
    return f"stopped after {lines[-1].strip()[:200]!r}" if lines else "wrote nothing"
