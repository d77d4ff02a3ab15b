"""The policies notebook's figure and verdict, from a ranking and confirmed rows built here."""

from __future__ import annotations

import matplotlib.pyplot as plt
import polars as pl
import pytest

from specbench.report import figures, verdicts
from specbench.report.figures.checks import figure_problems
from specbench.report.verdicts import INCONCLUSIVE, LOSES, PAYS

POLICIES = ["vllm", "sglang", "ollama", "auto"]


def _ranking() -> pl.DataFrame:
    """Two workloads where ollama then auto predict best, and one where nothing drafted (every policy ties)."""
    predictions = {"chat": [0.8, 0.9, 1.3, 1.1], "tool": [1.0, 1.05, 1.2, 1.4], "translation": [1.0] * 4}
    rows = []
    for workload, values in predictions.items():
        order = sorted(range(len(values)), key=lambda i: -values[i])
        for rank, i in enumerate(order, 1):
            rows.append({"workload": workload, "policy": POLICIES[i], "predicted_speedup": values[i], "rank": rank})
    return pl.DataFrame(rows)


def _confirmed(low: float | None, high: float | None, measured: float = 1.2, requests: int = 6) -> pl.DataFrame:
    return pl.DataFrame(
        [
            {
                "policy": "ollama",
                "requests": requests,
                "measured_speedup": measured,
                "measured_low": low,
                "measured_high": high,
                "predicted_speedup": 1.25,
                "residual": measured / 1.25 - 1,
            },
            {
                "policy": "auto",
                "requests": requests,
                "measured_speedup": 0.7,
                "measured_low": 0.6 if low is not None else None,
                "measured_high": 0.8 if high is not None else None,
                "predicted_speedup": 1.3,
                "residual": 0.7 / 1.3 - 1,
            },
        ],
        schema_overrides={"measured_low": pl.Float64, "measured_high": pl.Float64},
    )


@pytest.mark.parametrize("confirmed", [_confirmed(1.1, 1.3), _confirmed(None, None, requests=2), None])
def test_policy_ranking_passes_the_figure_checks(confirmed):
    fig = figures.policy_ranking(_ranking(), confirmed, title="m, suffix: draft-length policies")
    assert figure_problems(fig) == []
    assert len(fig.axes) == (1 if confirmed is None else 2)
    ranking = fig.axes[0]
    assert sorted(t.get_text() for t in ranking.get_legend().get_texts()) == sorted(POLICIES)
    outlined = [p for p in ranking.patches if not p.get_fill()]
    assert len(outlined) == 2  # the best of chat and tool; none on the tied workload
    if confirmed is not None:
        labels = [t.get_text() for t in fig.axes[1].get_legend().get_texts()]
        assert any(label.startswith("ollama: residual -4%") for label in labels)
    plt.close(fig)


def test_policy_ranking_says_when_nothing_was_replayed_or_confirmed():
    empty = figures.policy_ranking(_ranking().clear(), None)
    assert figure_problems(empty) == [] and empty.axes[0].texts
    unconfirmed = figures.policy_ranking(_ranking(), _confirmed(1.1, 1.3).clear())
    assert figure_problems(unconfirmed) == [] and unconfirmed.axes[1].texts
    plt.close("all")


def test_verdict_words_each_confirmed_policy_by_its_interval():
    text = verdicts.policies(_ranking(), _confirmed(1.1, 1.3), "m", "suffix", "6 prompt(s) x 24 tokens, greedy")
    assert "auto on 1, ollama on 1, every policy tied on 1 of 3 workload(s)" in text  # each workload counted once
    assert "not a measurement" in text and "6 prompt(s) x 24 tokens, greedy" in text
    assert (
        f"ollama {PAYS} (1.20x, 95 % interval over requests 1.10-1.30 of 6 requests), predicted 1.25x (residual -4%)"
        in text
    )
    assert (
        f"auto {LOSES} (0.70x, 95 % interval over requests 0.60-0.80 of 6 requests), predicted 1.30x (residual -46%)"
        in text
    )
    straddles = verdicts.policies(_ranking(), _confirmed(0.9, 1.4), "m", "suffix", "6 prompt(s)")
    assert f"ollama {INCONCLUSIVE} (1.20x, 95 % interval over requests 0.90-1.40 of 6 requests)" in straddles
    # the statements stored beside the words say the same of each confirmed policy
    for confirmed, words in (
        (_confirmed(1.1, 1.3), [PAYS, LOSES]),
        (_confirmed(None, None, requests=2), [INCONCLUSIVE] * 2),
    ):
        said = verdicts.policy_speeds(confirmed, "m", "suffix", "spec-bench question", "exact")
        assert [(v.policy, v.word, v.kind) for v in said] == list(
            zip(["ollama", "auto"], words, ["spec-bench question"] * 2)
        )


def test_a_prediction_alone_is_never_a_verdict():
    few = verdicts.policies(_ranking(), _confirmed(None, None, requests=2), "m", "suffix", "2 prompt(s)")
    assert f"ollama {INCONCLUSIVE} (1.20x over 2 request(s); an interval needs 3 requests)" in few
    assert PAYS not in few.replace(INCONCLUSIVE, "") and LOSES not in few
    unconfirmed = verdicts.policies(_ranking(), None, "m", "suffix", "no runs")
    assert "no speed verdict" in unconfirmed and PAYS not in unconfirmed and LOSES not in unconfirmed
    assert verdicts.policies(_ranking().clear(), None, "m", "suffix", "") == (
        "No policy was replayed: no workload had a recorded output."
    )
