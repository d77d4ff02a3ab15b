"""Verdicts in words, labelled key results, break-even figures that show a model never breaking even, progress
lines, and memory bandwidth against the measured peak."""

from __future__ import annotations

import io

import matplotlib

matplotlib.use("Agg")

import numpy as np
import polars as pl
from conftest import build_tiny

from specbench.cost import bandwidth
from specbench.cost.profile import Profile
from specbench.report import figures, verdicts
from specbench.report.progress import Heartbeat, console


def _profile(name: str, costs: list[float], overhead: float = 0.0, device: str = "cpu:test") -> Profile:
    widths = list(range(1, len(costs) + 1))
    return Profile(
        model=name,
        name=name,
        device=device,
        versions={},
        plain_step_s=0.01,
        widths={"fast": widths},
        costs={"fast": costs},
        seconds={"fast": [0.01 * c for c in costs]},
        overhead={"fast": overhead},
    )


def test_break_even_verdict_and_figure_say_when_a_model_never_breaks_even():
    dense = _profile("dense", [1.0, 1.1, 1.2, 1.3, 1.4])
    moe = _profile("moe", [1.0, 2.5, 3.6, 4.7, 5.8], overhead=0.5)  # c(k+1) > k+1 for every k
    text = verdicts.break_even([dense, moe], k_max=4)
    assert text.startswith("On this CPU:")
    assert "dense breaks even from acceptance" in text and "moe never breaks even" in text
    assert "c(2) = 3.00 plain steps" in text  # 2.5 + the 0.5 overhead, counted as the figures count it
    assert "dense breaks even from acceptance 0.10 per position (at its best k = 1; c(2) = 1.10" in text
    assert "grew by" in text and "faster for the second" in text
    fig = figures.break_even([dense, moe], k_max=4)
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert any("moe (fast): never breaks even" in t and "c(2) = 3.00" in t for t in legend)
    assert any("never breaks even" in t.get_text() for t in fig.axes[0].texts)  # the marked band
    costs = figures.verify_costs([dense, moe])
    assert any("c(2) = 3.00" in t.get_text() for t in costs.axes[0].get_legend().get_texts())
    assert any("engine overhead" in t.get_text() for t in costs.axes[0].get_legend().get_texts())


def test_sweep_verdict_names_the_best_method_and_outputs():
    summary = pl.DataFrame(
        {
            "drafter": ["lookup", "suffix", "suffix"],
            "policy": ["fixed:3", "fixed:3", "auto"],
            "k": [3, 3, None],
            "mean_k": [3.0, 3.0, 2.4],
            "runs": [2, 2, 2],
            "speedup": [0.81, 0.92, 0.6],
            "all_equal_to_plain": [True, True, True],
        }
    )
    text = verdicts.sweep(summary, "SmolLM2-135M")
    assert text.startswith("On this CPU speculation does not pay for SmolLM2-135M: best 0.92x, suffix, fixed:3")
    assert "worst 0.60x (suffix, auto)" in text and "every greedy output equal" in text
    assert verdicts.pays(1.2) == "pays" and verdicts.pays(1.01) == "breaks even"


def test_key_results_carry_words_and_units():
    assert verdicts.describe("smollm2-135m-moe a*(4)", None) == (
        "smollm2-135m-moe: break-even acceptance a*(4) for a draft of 4",
        "never breaks even",
    )
    label, value = verdicts.describe("mean_abs_prediction_error", 0.436)
    assert "prediction error" in label and value == "44%"
    assert verdicts.describe("lossless_tvd", 0.35)[0].startswith("losslessness: total variation distance")
    assert verdicts.describe("dense c(2)", 3.04) == (
        "dense: verify cost c(2), engine overhead included",
        "3.04 plain steps",
    )


def test_per_position_figure_shows_intervals_counts_and_both_definitions():
    positions = pl.DataFrame(
        {
            "drafter": ["lookup"] * 3,
            "policy": ["fixed:3"] * 3,
            "position": [1, 2, 3],
            "reached": [20, 10, 5],
            "accepted": [10, 5, 1],
            "rate": [0.5, 0.5, 0.2],
        }
    )
    fig = figures.per_position(positions)
    ax = fig.axes[0]
    assert "P(i accepted | 1..i-1 accepted)" in ax.get_ylabel()
    assert [t.get_text() for t in ax.texts] == ["20", "10", "5"]
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert any(t.startswith("unconditional") for t in legend)
    unconditional = [line for line in ax.lines if line.get_linestyle() == "--" and len(line.get_xdata())]
    np.testing.assert_allclose(unconditional[0].get_ydata(), [0.5, 0.25, 0.05])


def test_progress_lines_and_heartbeat():
    stream = io.StringIO()
    console("grid", stream)({"model": "m-1234", "a": 0.5, "k": 2, "speedup": 0.91234, "rows": [1, 2]})
    assert stream.getvalue().startswith("[0:00 grid] a 0.5, k 2, speedup 0.912\n")
    beat = Heartbeat("sweep", expected_s=120, every_s=0.05, stream=stream)
    assert beat.line(30) == "sweep: running 0:30 of ~2:00 expected (about 1:30 left)"
    assert beat.line(150) == "sweep: running 2:30, 0:30 past the ~2:00 expected"
    with beat:
        import time

        time.sleep(0.2)
    assert "sweep: running 0:00" in stream.getvalue()


def test_bandwidth_counts_only_the_experts_a_token_uses_and_caches_the_peak(tmp_path, monkeypatch):
    dense = build_tiny("qwen3")
    moe = build_tiny("qwen3_moe")  # 8 experts, top-2
    dense_bytes = bandwidth.bytes_per_token(dense)  # untied: the embedding table is gathered, not read whole
    assert dense_bytes == sum(v.nbytes for v in _leaves(dense.parameters())) - dense.model.embed_tokens.weight.nbytes
    args = moe.args
    experts = sum(layer.mlp.switch_mlp.gate_proj.weight.nbytes * 3 for layer in moe.model.layers)  # gate, up, down
    everything = sum(v.nbytes for v in _leaves(moe.parameters()))
    embed = moe.model.embed_tokens.weight.nbytes
    expected = everything - embed - experts + experts * args.num_experts_per_tok / args.num_experts
    assert abs(bandwidth.bytes_per_token(moe) - expected) <= 8
    calls = []
    monkeypatch.setattr(bandwidth, "_measure_peak", lambda: calls.append(1) or 2e9)
    bandwidth._peaks.clear()
    assert bandwidth.peak_bandwidth(tmp_path) == 2e9
    bandwidth._peaks.clear()
    assert bandwidth.peak_bandwidth(tmp_path) == 2e9 and len(calls) == 1  # read back from the file
    reading = bandwidth.achieved(dense, 10.0, tmp_path)
    assert reading.bytes_per_s == 10.0 * dense_bytes and "of this device's measured 2.0 GB/s" in reading.describe()


def test_the_peak_is_the_fastest_pass_and_every_pass_is_measured(monkeypatch):
    passes = bandwidth.mlx_passes(2**20, repeats=1)  # what a GPU runs (over 1 GiB there), small on the CPU
    assert set(passes) == {"sum", "matrix-vector"} and all(v > 0 for v in passes.values())
    monkeypatch.setattr(bandwidth, "peak_passes", lambda *a: {"sum": 3e9, "matrix-vector": 5e9})
    assert bandwidth._measure_peak() == 5e9


def _leaves(tree):
    from mlx.utils import tree_flatten

    return [v for _, v in tree_flatten(tree)]


def test_a_method_that_drafted_nothing_is_not_called_a_speedup():
    stats = {"verifies": 0, "tokens": 8}
    assert "proposed nothing to verify" in verdicts.quickstart("m", "lookup", "fixed:4", stats, 1.3, True)
    sweep = pl.DataFrame(
        {
            "drafter": ["none", "lookup", "suffix"],
            "policy": ["none", "auto", "fixed:3"],
            "speedup": [1.0, 1.4, 0.8],
            "verifies": [0, 0, 5],
            "runs": [2, 2, 2],
            "k": [None, None, 3],
            "all_equal_to_plain": [None, True, True],
        }
    )
    assert "best 0.80x, suffix, fixed:3" in verdicts.sweep(sweep, "m")  # not lookup's 1.40x of plain steps
    traces = pl.DataFrame(
        {"method": ["plain", "suffix"], "speedup": [1.0, 1.6], "tokens_per_verify": [0.0, 0.0], "identical": [True] * 2}
    )
    assert "no drafter proposed anything" in verdicts.traces(traces, "m")
    # over several traces: the overall speedup, with its interval over traces where it has one
    overall = pl.DataFrame(
        {
            "method": ["plain", "suffix", "lookup"],
            "traces": [8, 8, 8],
            "speedup": [1.0, 1.31, 1.1],
            "speedup_low": [None, 1.12, 0.95],
            "speedup_high": [None, 1.52, 1.2],
            "tokens_per_verify": [0.0, 2.5, 1.4],
            "identical": [True] * 3,
        }
    )
    text = verdicts.traces(overall, "m")
    assert "best suffix at 1.31x over 8 traces [95 % interval over traces 1.12-1.52]" in text
    assert "over 8 traces" not in verdicts.traces(overall.with_columns(pl.lit(1).alias("traces")), "m")


def test_reference_contrast_says_what_this_machine_and_the_reference_show():
    from specbench.cost.reference import reference_profiles

    reference = reference_profiles()
    dense = _profile("smollm2-135m", [1.0, 1.1, 1.2, 1.3, 1.4])
    dense.kernels = "cpu:test|mlx 0|mlx_lm 0|blas OpenBLAS 0.3.21, 2 threads"
    moe = _profile("synthetic:smollm2-135m-16e-fp32", [1.0, 1.9, 2.8, 3.7, 4.6])
    text = verdicts.reference_contrast({"dense": dense, "MoE": moe}, reference, "fast", 0.0, 4)
    mine, theirs = text.split(" On the NVIDIA H200 reference (mlx ")
    assert mine.startswith("On this CPU (OpenBLAS 0.3.21, 2 threads): c(w) grows 0.10 plain steps per added row")
    assert "0.90 for the MoE (the MoE's grows faster)" in mine
    assert "same widths (1-5)" in theirs and "for the MoE (the MoE's grows slower)" in theirs  # the H200's data
    alike = verdicts.reference_contrast({"dense": dense, "MoE": dense}, reference, "fast", 0.0, 4)
    assert "(about alike)" in alike.split(" On the ")[0]
    alone = verdicts.reference_contrast({"dense": dense}, reference, "fast", 0.0, 4)
    assert alone.startswith("This machine has no dense and MoE fast profiles to compare. On the NVIDIA H200")
    fig = figures.beside_reference([dense, moe], reference, "fast", 0.0, 4)
    titles = [ax.get_title() for ax in fig.axes]
    assert titles[0].startswith("This machine: test (OpenBLAS 0.3.21, 2 threads)")
    assert titles[1].startswith("NVIDIA H200 reference") and "widths 1-5" in titles[1]
    assert all(ax.get_xlabel() and ax.get_ylabel() for ax in fig.axes)
    assert max(max(line.get_xdata(), default=0) for line in fig.axes[1].get_lines()) <= 5  # cut to this run's widths
