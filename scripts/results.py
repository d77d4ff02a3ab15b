"""reports/RESULTS.md and README.md's results, generated from the result files under reports/.

    python -m scripts.results            # rewrite reports/RESULTS.md and the README's results block
    python -m scripts.results --check    # CI (``make lint``): exit 1, with one line, where they say otherwise

A claim (``Claim``, listed in ``CLAIMS``) is fixed before its run: the one metric it reports, the file it reads
that metric from (``Json``, ``Csv`` or ``Text``: where the value, its 95 % interval and its sample size lie), and
the code it measures (``CODE`` and any paths it adds). Each line of the output shows the value, the interval, the
sample size, the device, the commit and the date the file names, and the line's status:

- ``current``: the file names a commit of this history, from a clean tree, and none of the code the claim
  measures changed between that commit and HEAD (nor in the working tree);
- ``stale: ...``: the file names no commit (provenance unknown), a modified tree, a commit this history lacks,
  or the code it measures changed after it (the first such commit is named);
- ``failed: ...``: the run's A/A arm (the baseline timed against itself, ``scripts.result_lines.AACheck``) has
  an interval that excludes 1.0, or none: the machine's noise was larger than the run can tell apart;
- ``unsupported: ...``: the file no longer holds the claim's run (a later run overwrote it), or its sample is
  empty (a result over zero runs);
- ``missing: ...``: the file is absent.

Check mode regenerates both texts in memory and compares them with the committed files line by line. Every part of
a line but its status must be identical. A status may differ only where the committed one says ``stale``: a line's
staleness depends on HEAD, so it flips to stale when the code it measures changes after the result was committed
(and must then be regenerated: the committed file claims a stale number current, and the check fails naming it),
but a line already marked stale stays acceptable, whatever the reason given. Lines whose commit the clone lacks
(a shallow clone) are accepted as committed, since the clone cannot tell.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from scripts.result_claims import CLAIMS
from scripts.result_lines import README, RESULTS, Claim, first_difference, generate, readme_status, shallow_clone
from specbench.common.files import write_text_atomic

ROOT = Path(__file__).resolve().parents[1]


def main(argv: Sequence[str] | None = None, root: Path = ROOT, claims: Sequence[Claim] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with the committed files; write nothing")
    args = parser.parse_args(argv)
    results, readme = generate(root, CLAIMS if claims is None else claims)
    if args.check:
        committed = root / RESULTS
        old = committed.read_text(encoding="utf-8") if committed.is_file() else ""
        shallow = shallow_clone(root)
        problem = first_difference(RESULTS, old, results, shallow) or first_difference(
            README, (root / README).read_text(encoding="utf-8"), readme, shallow, readme_status
        )
        if problem:
            print(problem, file=sys.stderr)
            return 1
        return 0
    write_text_atomic(root / RESULTS, results)
    write_text_atomic(root / README, readme)
    print(f"wrote {RESULTS} and {README}'s results")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
