"""Run by tests/common/test_stored_files.py, two at once: ``stored_writer.py WHO ROUNDS REPORT`` writes its
own part of every kind of stored file (profile modes and drafters, tree-cost node counts, calibration widths,
report statuses and report.json keys) ROUNDS times, each read, merged and written again."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from specbench.cost.profile import Profile, save_profile
from specbench.cost.trees import TreeCosts, save_tree_costs
from specbench.exact.calibration import Calibration, WidthCalibration, _save
from specbench.report.index import write_index, write_report_info, write_status

if __name__ == "__main__":
    who, rounds, report = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
    side = 0 if who == "a" else 1
    mode = ("fast", "exact")[side]
    names = {f"{w}{r}": f"{w}{r}" for w in "ab" for r in range(rounds)}
    report.mkdir(parents=True, exist_ok=True)
    (report / f".ready-{who}").write_text("")
    while not all((report / f".ready-{w}").exists() for w in "ab"):  # both start writing together
        time.sleep(0.01)
    for r in range(rounds):
        drafters = {f"{who}{r}": {"k": 4, "d": 0.1}}
        profile = Profile("m", "m", "cpu", {"mlx": "0"}, 0.01, {mode: [1, 2]}, {mode: [1.0, 1.5]}, {mode: [0.01, 0.02]})
        profile.drafters = drafters
        save_profile(profile)
        n = 2 * r + 1 + side
        save_tree_costs(TreeCosts("m", "cpu", {"mlx": "0"}, "fast", 0.01, [n], [1.5], [1.4], [0.015], [0.014]))
        _save(Calibration("key", "cpu", {"mlx": "0"}, {n + 1: WidthCalibration(n + 1, "none")}))
        write_status(report, f"{who}{r}", {"notebook": f"{who}{r}", "status": "done", "seconds": 1.0})
        write_index(report, names)
        write_report_info(report, {f"{who}{r}": r})
