"""The type checker on the package, at a baseline of errors that only goes down.

    python -m scripts.typecheck            # mypy on specbench/; fails where it finds more errors than the baseline
    python -m scripts.typecheck --update   # write today's count as the baseline (only ever lower it)

The baseline (``.ci/mypy-baseline``: one number) is the count of mypy's errors when the checker came in; every change
keeps the count at most there, and a change that fixes some lowers it (the script says so). ``make lint`` runs it.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from mypy import api

ROOT = Path(__file__).resolve().parents[1]
BASELINE = ROOT / ".ci" / "mypy-baseline"


def count_errors() -> tuple[int, str]:
    """mypy's error count on specbench/ (its settings in pyproject.toml), and its report."""
    out, err, _ = api.run([str(ROOT / "specbench")])
    found = re.search(r"Found (\d+) errors? in", out)
    if found is None and "Success" not in out:
        raise SystemExit(f"mypy did not run: {(err or out).strip()[-500:]}")
    return (int(found[1]) if found else 0), out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--update", action="store_true", help="write today's count as the baseline")
    args = parser.parse_args()
    errors, report = count_errors()
    baseline = int(BASELINE.read_text().strip())
    if args.update:
        if errors > baseline:
            raise SystemExit(f"mypy: {errors} errors, over the baseline {baseline}: fix them rather than raise it")
        BASELINE.write_text(f"{errors}\n")
        print(f"mypy: baseline {baseline} -> {errors}")
        return 0
    if errors > baseline:
        new = "\n".join(line for line in report.splitlines() if ": error:" in line)
        print(new[-6000:])
        print(f"mypy: {errors} errors, over the baseline of {baseline}: a change added {errors - baseline}")
        return 1
    lower = " (lower the baseline: python -m scripts.typecheck --update)" if errors < baseline else ""
    print(f"mypy: {errors} errors, baseline {baseline}{lower}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
