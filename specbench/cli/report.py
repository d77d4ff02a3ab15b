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
        help="quick: a few minutes, tiny models (CI); full: the embedded model, about 8.5 min on 2 idle CPU cores",
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
        "--notebooks",
        default=None,
        metavar="DIR",
        help="folder of the notebooks (default: notebooks/ of the source checkout)",
    )

    def run(args):
        from specbench.common import distributed
        from specbench.report.runner import parse_assignments, run_report

        missing = [name for name in REPORT_EXTRA if importlib.util.find_spec(name) is None]
        if missing:
            raise ValueError(
                f"{', '.join(missing)} not installed: install the report extra, pip install 'specbench[report]'"
            )
        parameters = parse_assignments(args.param)
        result = run_report(args.profile, args.out, parameters, args.only, args.force, notebooks=args.notebooks)
        if distributed.rank() != 0:  # under mlx.launch: rank 0 prints every rank's results
            return 1 if result.failed else 0
        print(f"report: {result.index}")
        for r in result.results:
            print(f"  {r.notebook:20s} {r.status:8s} {r.seconds:7.0f} s  {r.error}")
        return 1 if result.failed else 0

    return run
