"""`specbench report`: the notebooks executed into reports/NAME."""

from __future__ import annotations

import argparse
import importlib.util

from specbench.cli.registry import command

#: What the report extra (``specbench[report]``) brings that ``specbench report`` runs: notebooks, figures, HTML.
REPORT_EXTRA = ("papermill", "nbconvert", "matplotlib", "ipykernel")


# -- report ------------------------------------------------------------------------------------
@command("report", "execute the notebooks with papermill into reports/NAME (HTML, figures, logs, index.html)")
def _report(parser: argparse.ArgumentParser):
    from specbench.report.runner import NOTEBOOKS, PROFILES

    parser.add_argument(
        "--profile",
        choices=list(PROFILES),
        default="full",
        help="quick: a few minutes, tiny models (CI); full: the embedded model, about 13 CPU minutes "
        "(`make report` spreads them over 2 ranks)",
    )
    parser.add_argument(
        "--model",
        default=None,
        help="run every page on this model (an embedded short name, an mlx-lm folder or a Hugging Face id) instead "
        "of the profile's; the time it will take is printed from its cost model before the notebooks start",
    )
    parser.add_argument("--out", default=None, help="output folder (default reports/PROFILE)")
    parser.add_argument(
        "-p",
        "--param",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="set a notebook parameter (every notebook that has it; NOTEBOOK.KEY=VALUE for one); lists as a,b,c",
    )
    parser.add_argument(
        "--only",
        action="append",
        default=None,
        choices=list(NOTEBOOKS),
        metavar="NOTEBOOK",
        help=f"run only this notebook (repeatable): {', '.join(NOTEBOOKS)}",
    )
    parser.add_argument("--force", action="store_true", help="run notebooks again even if they finished")
    parser.add_argument(
        "--ranks",
        type=int,
        default=1,
        help="run the notebooks on this many local processes (ranks of MLX's ring backend, started directly: "
        "mlx.launch's own loop would take a core), the cores' BLAS threads shared among them; rank 0 writes "
        "the index from every rank's notebooks (default 1)",
    )
    parser.add_argument(
        "--notebooks",
        default=None,
        metavar="DIR",
        help="folder of the notebooks (default: notebooks/ of the source checkout)",
    )

    def run(args):
        from specbench.common import distributed
        from specbench.report.runner import NOTEBOOKS, parse_assignments, run_report

        if missing := [name for name in REPORT_EXTRA if importlib.util.find_spec(name) is None]:
            raise ValueError(
                f"{', '.join(missing)} not installed: install the report extra, pip install 'specbench[report]'"
            )
        parameters = parse_assignments(args.param)
        if args.model is not None:
            from specbench.models.load import check_model

            check_model(args.model)  # one line before any model work
            pages = set(args.only or NOTEBOOKS)
            dense = {"dense_model": args.model} if pages & {"break_even", "batch_break_even"} else {}
            parameters = {"model": args.model, **dense, **parameters}
        if args.ranks < 1:
            raise ValueError(f"--ranks must be at least 1, got {args.ranks}")
        if args.ranks > 1 and distributed.launched_backend() is None:
            return _start_ranks(args)
        result = run_report(args.profile, args.out, parameters, args.only, args.force, notebooks=args.notebooks)
        if distributed.rank() != 0:  # under mlx.launch: rank 0 prints every rank's results
            return 1 if result.failed else 0
        print(f"report: {result.index}")
        for r in result.results:
            print(f"  {r.notebook:20s} {r.status:8s} {r.seconds:7.0f} s  {r.error}")
        return 1 if result.failed else 0

    return run


def _start_ranks(args: argparse.Namespace) -> int:
    """``specbench report`` again on ``args.ranks`` local ranks into one folder: rank 0 on this console, the
    others into ``rank<R>.log`` there; each rank's BLAS gets an equal share of the cores."""
    import os
    import sys
    import tempfile
    from pathlib import Path

    from specbench.common import distributed

    out = Path(args.out or Path("reports") / args.profile).resolve()
    out.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "specbench", "report", "--profile", args.profile, "--out", str(out)]
    command += [f"--param={p}" for p in args.param] + [f"--only={n}" for n in args.only or []]
    command += [f"--model={args.model}"] * (args.model is not None)
    command += ["--force"] * args.force + ([f"--notebooks={args.notebooks}"] if args.notebooks else [])
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    threads = str(max(1, cores // args.ranks))
    envs = distributed.local_ring_env(args.ranks, distributed.free_ports(args.ranks), tempfile.mkdtemp())
    envs = [{"OPENBLAS_NUM_THREADS": os.environ.get("OPENBLAS_NUM_THREADS", threads), **env} for env in envs]
    logs = [None] + [str(out / f"rank{r}.log") for r in range(1, args.ranks)]
    print(f"report on {args.ranks} ranks, {threads} BLAS thread(s) each; ranks 1+ write {out}/rank<R>.log", flush=True)
    return distributed.run_ranks(command, envs, logs)
