"""Exact calibration spread over 2 local ranks (ring backend), each with a store of its own: each rank calibrates
its share of the widths, and both end holding every width, in memory and stored."""

from __future__ import annotations

import json

from launching import HERE, launch_ranks


def test_each_rank_calibrates_its_share_and_holds_every_width(tmp_path):
    launch_ranks(HERE / "calibration_ranks.py", tmp_path)
    results = [json.loads((tmp_path / f"calibration{r}.json").read_text()) for r in range(2)]
    assert sorted(r["calibrated_here"] for r in results) == [2, 2]  # widths 2-5 by cost: {2, 5} and {3, 4}
    for result in results:
        assert result["held"] == {str(w): [32, 255] for w in (2, 3, 4, 5)}
        assert result["stored"] == [2, 3, 4, 5]
