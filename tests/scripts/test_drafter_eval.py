"""scripts.gpu.drafter_eval: scoring drafters on a held-out split, the head's decision and the report."""

from __future__ import annotations

import pytest
from conftest import build_tiny

from scripts.gpu import drafter_eval
from scripts.gpu.draft_training import HELDOUT_KINDS


def rows(per_position: list[float], tokens_per_verify: float) -> dict:
    row = {"per_position_acceptance": per_position, "conditional_acceptance": [1.0, 0.5, 0.5]}
    row |= {"tokens_per_verify": tokens_per_verify, "seconds": 2.0, "draft_seconds_per_token": 0.01}
    return {kind: dict(row) for kind in HELDOUT_KINDS}


def test_a_new_head_ships_only_when_it_scores_higher():
    better, worse = rows([0.6, 0.4, 0.36], 2.1), rows([0.5, 0.3, 0.2], 1.8)
    decision = drafter_eval.head_decision(better, worse)
    assert decision["ships"] and decision["new_meets_targets"] and decision["new_score"] == pytest.approx(2.1)
    assert "the new head ships" in decision["decision"]
    kept = drafter_eval.head_decision(worse, better)
    assert not kept["ships"] and not kept["new_meets_targets"] and "does not meet" in kept["decision"]


def test_the_report_holds_every_drafter_and_what_was_skipped():
    results = {"evaluation": {"mtp (new)": rows([0.6, 0.4, 0.3], 2.0)}, "skipped": ["early exit"]}
    results["plain"] = {kind: {"seconds": 4.0, "tokens": 100} for kind in HELDOUT_KINDS}
    text = drafter_eval.report(results)
    assert sum(line.startswith("| mtp (new) |") for line in text.splitlines()) == len(HELDOUT_KINDS)
    assert "| 2.00 |" in text and "skipped (they would have overrun the budget): early exit" in text


def test_plain_seconds_count_the_tokens_decoded_per_kind():
    split = {"prompts": {kind: [[1, 2, 3], [4, 5]] for kind in HELDOUT_KINDS}}
    plain = drafter_eval.plain_seconds(build_tiny("llama"), split, 4)
    assert all(plain[kind]["tokens"] == 8 and plain[kind]["seconds"] > 0 for kind in HELDOUT_KINDS)
