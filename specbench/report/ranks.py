"""``specbench report`` spread over the ranks of ``mlx.launch``: each rank runs its share of the notebooks
(``notebooks_here``) into its own ``--out``, and rank 0 ends with the report folder a single run writes
(``merge_ranks``). Papermill's kernels run in a world of one (``distributed.detach_children``), each on its rank's
GPU where there are several (``CUDA_VISIBLE_DEVICES``, set per rank by ``mlx.launch --backend nccl``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from specbench.common import distributed
from specbench.common.files import inside, write_bytes_atomic
from specbench.report.profiles import READS_FROM

#: Weight of a notebook without an expected time: the mean of those known (this when none is).
_UNKNOWN_SECONDS = 60.0


def notebooks_here(expected: dict[str, float | None], to_run: dict[str, Any]) -> dict[str, float | None]:
    """This rank's notebooks with their expected seconds, in report order (``expected`` itself in a world of
    one). Rank 0's ``expected`` and ``to_run`` (truthy: the notebook runs) decide for every rank: the
    notebooks not to run stay on rank 0 (it reports them done), the others are split so that each rank's
    expected seconds are about equal, a notebook that reads another's records (``READS_FROM``) on that one's rank."""
    if distributed.size() == 1:
        return dict(expected)
    expected, to_run = distributed.broadcast((dict(expected), {n: bool(v) for n, v in to_run.items()}))
    distributed.detach_children()
    known = [float(v) for v in expected.values() if v]
    default = sum(known) / len(known) if known else _UNKNOWN_SECONDS
    running = [n for n in expected if to_run.get(n, True)]
    groups = run_together(running)
    weights = [sum(float(expected[n] or default) for n in group) for group in groups]
    mine = {n for i in distributed.my_share(weights) for n in groups[i]}
    if distributed.is_main():
        mine |= {n for n in expected if n not in running}
    return {n: v for n, v in expected.items() if n in mine}


def run_together(names: Sequence[str]) -> list[list[str]]:
    """``names`` in groups that must run on one rank, in order: a notebook that reads another's records
    (``READS_FROM``) joins that one's group when both run."""
    groups: dict[str, list[str]] = {}
    for name in names:
        source = READS_FROM.get(name)
        groups.setdefault(source if source in names else name, []).append(name)
    return list(groups.values())


def _notebook_files(out: Path, name: str) -> list[str]:
    """A notebook's files in report folder ``out`` (relative paths): executed notebook, HTML and its folder
    (status, summary, figures, logs, tables), the status last."""
    folder = out / name
    inside = sorted(str(p.relative_to(out)) for p in folder.rglob("*") if p.is_file() and not p.name.startswith("."))
    status = f"{name}/status.json"
    listed = [f for f in (f"{name}.ipynb", f"{name}.html") if (out / f).is_file()]
    return listed + [f for f in inside if f != status] + ([status] if status in inside else [])


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def merge_ranks(out: Path, results: list[Any], order: Sequence[str]) -> list[Any]:
    """Every rank's results (objects with a ``notebook`` attribute), sorted by ``order``, on every rank; rank
    0's folder ``out`` receives the files of the other ranks' notebooks it lacks or holds otherwise.
    ``results`` itself in a world of one."""
    if distributed.size() == 1:
        return results
    out = Path(out)
    manifests = distributed.gather_outcomes(
        lambda: {f: _digest(out / f) for r in results for f in _notebook_files(out, r.notebook)}
    )
    wanted: dict[int, list[str]] = {}
    if distributed.is_main():
        for sender, files in enumerate(manifests[1:], start=1):
            wanted[sender] = [f for f, digest in files.items() if not (out / f).is_file() or _digest(out / f) != digest]
    wanted = distributed.broadcast(wanted)
    mine = wanted.get(distributed.rank(), [])
    parts = distributed.gather_outcomes(lambda: (results, [(f, (out / f).read_bytes()) for f in mine]))
    if distributed.is_main():
        for sender, (_, files) in enumerate(parts[1:], start=1):
            for relative, data in files:  # each notebook's status comes last
                write_bytes_atomic(inside(out, relative, f"a file from rank {sender}"), data)
    merged = [r for rank_results, _ in parts for r in rank_results]
    position = {name: i for i, name in enumerate(order)}
    return sorted(merged, key=lambda r: position.get(r.notebook, len(position)))
