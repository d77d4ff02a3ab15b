"""The report's answer: every number computed from the stored records (the sweep's pairs, the cost model), verdicts
from intervals alone, estimates inside their intervals, and one line naming the cost model."""

from __future__ import annotations

import math
import re

import polars as pl
import pytest

from specbench.common.timing import quiet
from specbench.cost.breakeven import break_even_acceptance
from specbench.cost.profile import Profile
from specbench.report.answer import NEVER_DRAFTED, SWEEP_RUNS, answer_cells, answer_html, verdict_of


def _runs(cells: dict[tuple[str, str], float], pairs: int = 6, drafted: int = 30, accepted: int = 21) -> pl.DataFrame:
    """Timed pairs: per (drafter, kind) a method ``ratio`` times as fast as its plain run, the ratio wobbling by
    +-2 % from pair to pair; 10 verifications of 3 drafted tokens each."""
    rows = []
    for (drafter, kind), ratio in cells.items():
        for pair in range(pairs):
            wobble = 1 + 0.02 * (-1) ** pair
            rows.append(
                {
                    "drafter": drafter,
                    "category": kind,
                    "policy": "fixed:3",
                    "prompt": f"{kind}-{pair % 3}",
                    "temperature": 0.0,
                    "seed": 0,
                    "pair": pair,
                    "verify_mode": "exact",
                    "decode_tokens": 32,
                    "decode_s": 1.0 / (ratio * wobble),
                    "plain_decode_tokens": 32,
                    "plain_decode_s": 1.0,
                    "steps": 10,
                    "verifies": 10,
                    "drafted": drafted,
                    "accepted": accepted,
                    "equal_to_plain": True,
                    "main_reason": "drafter-short: 2 of 3 drafted" if pair % 3 else "pipelined",
                }
            )
    return pl.DataFrame(rows)


def _profile() -> Profile:
    widths = [1, 2, 3, 4, 5]
    costs = [1.0, 1.2, 1.4, 1.6, 1.8]
    return Profile(
        model="m",
        name="m",
        device="cpu:test",
        versions={},
        plain_step_s=0.1,
        widths={"exact": widths},
        costs={"exact": costs},
        seconds={"exact": [0.1 * c for c in costs]},
        intervals={"exact": [[c - 0.1, c + 0.2] for c in costs]},
    )


def test_verdicts_come_from_the_interval_alone():
    assert verdict_of(1.1, 1.4, 6) == "pays" and verdict_of(0.7, 0.9, 6) == "loses"
    assert verdict_of(0.9, 1.2, 6) == "no difference resolvable"
    assert verdict_of(None, None, 3).startswith("no interval (3 pairs")


def test_each_cell_states_its_speedup_interval_sample_and_break_even():
    runs = _runs({("lookup", "copy"): 1.5, ("suffix", "copy"): 0.8, ("lookup", "qa"): 1.0})
    cells = {(c.drafter, c.kind): c for c in answer_cells(runs, _profile())}
    assert cells["lookup", "copy"].verdict == "pays" and cells["suffix", "copy"].verdict == "loses"
    assert cells["lookup", "qa"].verdict == "no difference resolvable"
    for cell in cells.values():
        assert cell.low <= cell.speedup <= cell.high  # an estimate inside its interval
        assert cell.pairs == 6 and cell.prompts == 3 and cell.k == 3
        assert cell.tokens_per_verify == pytest.approx((21 + 10) / 10)  # accepted + 1 per verification
        assert cell.acceptance == pytest.approx(0.7)
        # the break-even is the cost model's, its band from c(w)'s interval
        assert cell.break_even == pytest.approx(float(break_even_acceptance(_profile(), 0.0, 3, "exact")[2]))
        assert cell.band[0] < cell.break_even < cell.band[1]
        assert f"over the break-even {cell.break_even:.3g}" in cell.why
        assert cell.why.endswith("; mostly drafter-short: 2 of 3 drafted")  # its runs' most frequent reason
    assert math.isclose(cells["lookup", "copy"].speedup, 1.5, rel_tol=0.01)


def test_a_cell_without_enough_pairs_has_no_verdict_and_no_cost_model_no_break_even():
    cells = answer_cells(_runs({("lookup", "copy"): 1.5}, pairs=3), None)
    assert cells[0].low is None and cells[0].verdict.startswith("no interval")
    assert cells[0].break_even is None and "no cost model" in cells[0].why


def test_a_verdict_on_the_index_is_at_most_two_sentences_and_60_words():
    from specbench.report.index import brief

    long = "First sentence here. Second one (with 1.5x). Third sentence never shown."
    assert brief(long) == "First sentence here. Second one (with 1.5x). ..."
    wall = " ".join(["word"] * 200) + "."
    assert len(brief(wall).split()) == 60 and brief(wall).endswith("...")
    assert brief("Short.") == "Short."
    exactly = " ".join(["w"] * 59) + ". Next."  # the "..." of a third sentence counts too
    assert len(brief(exactly + " Third.").split()) <= 60


def test_a_cell_that_never_drafted_says_so_rather_than_state_its_overhead_as_a_speedup(tmp_path):
    """A policy that never drafts (auto where drafting does not pay) decodes plainly: its ratio against plain
    decoding is the policy's own overhead, stated in its why, its verdict "never drafted"."""
    runs = _runs({("lookup", "copy"): 0.2}, drafted=0, accepted=0).with_columns(pl.lit(0).alias("verifies"))
    (cell,) = answer_cells(runs, _profile())
    assert cell.verdict == NEVER_DRAFTED and cell.acceptance is None and cell.low is not None
    assert cell.why.startswith(f"no draft was made: the policy decoded plainly, so its {cell.speedup:.3g}x [")
    (tmp_path / SWEEP_RUNS).parent.mkdir(parents=True)
    runs.write_parquet(tmp_path / SWEEP_RUNS)
    row = answer_html(tmp_path, "m").split("<tr>")[-1]
    assert "<td>no drafts</td>" in row and "never drafted" in row and "6 pairs, 3 prompts" in row


def test_the_answer_states_the_agentic_kinds_cells_with_interval_and_sample(tmp_path):
    """The full profile's sweep on the agentic kind (its drafters, policies, prompts and pairs; the miniature of the
    embedded model and 8 tokens, for time): a cell per drafter x policy, each with its interval and sample."""
    from specbench.bench import sweep
    from specbench.inputs.prompts import AGENTIC, prompts_from
    from specbench.models.load import load
    from specbench.report.profiles import PROFILES

    sample = PROFILES["full"]["draft_length_sweep"]
    assert AGENTIC in sample["categories"]
    model, tokenizer = load("tiny:smollm2-135m")
    prompts = prompts_from(
        "bundled", tokenizer, [AGENTIC], sample["prompts_per_category"], max_prompt_tokens=sample["max_prompt_tokens"]
    )
    with quiet():  # one collection for all its timed runs (each would collect the test process's heap: ~0.1 s)
        result = sweep.run_sweep(
            model,
            tokenizer,
            prompts,
            sample["drafters"],
            sweep.sweep_policies(sample["policies"], sample["draft_lengths"]),
            max_tokens=8,
            progress=False,
            pairs=sample["pairs"],
            warmup_tokens=0,
            verify="fast",  # no exact calibration of the miniature at the turns' lengths: the cells are the point
        )
    cells = [c for c in answer_cells(result.runs, None) if c.kind == AGENTIC]
    assert {(c.drafter, c.policy) for c in cells} == {
        ("lookup", "fixed:3"),
        ("lookup", "auto"),
        ("suffix:8", "fixed:3"),
        ("suffix:8", "auto"),
    }
    for cell in cells:
        assert cell.prompts == len(prompts) == 3 and cell.pairs == 3 * sample["pairs"] >= 6
        assert cell.low is not None and cell.low <= cell.speedup <= cell.high
    (tmp_path / SWEEP_RUNS).parent.mkdir(parents=True)
    result.runs.write_parquet(tmp_path / SWEEP_RUNS)
    rows = [row for row in answer_html(tmp_path, "tiny").split("<tr>") if f"<td>{AGENTIC}</td>" in row]
    assert len(rows) == 4
    for row in rows:
        assert re.search(r"\[\d[\d.]*-\d[\d.]*\]", row) and f"{3 * sample['pairs']} pairs, 3 prompts" in row
