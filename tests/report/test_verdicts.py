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
from specbench.report.verdicts import INCONCLUSIVE, OWN_PROMPT, SummaryRow
from specbench.report.verdicts.labels import describe


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


def _trace_overall() -> pl.DataFrame:
    """A trace replay's overall table: suffix fastest over 8 traces, with intervals over traces."""
    return pl.DataFrame(
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


def test_break_even_verdict_and_figure_say_when_a_model_never_breaks_even():
    dense = _profile("dense", [1.0, 1.1, 1.2, 1.3, 1.4])
    moe = _profile("moe", [1.0, 2.5, 3.6, 4.7, 5.8], overhead=0.5)  # c(k+1) > k+1 for every k
    text = verdicts.break_even([dense, moe], max_k=4)
    assert text.startswith("On this CPU:")
    assert "dense breaks even from acceptance" in text and "moe never breaks even" in text
    assert "c(2) = 3.00 plain steps" in text  # 2.5 + the 0.5 overhead, counted as the figures count it
    assert "dense breaks even from acceptance 0.10 per position (at its best k = 1; c(2) = 1.10" in text
    assert "grew by" in text and "faster for the second" in text
    fig = figures.break_even([dense, moe], max_k=4)
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert any("moe (fast): never breaks even" in t and "c(2) = 3.00" in t for t in legend)
    assert any("never breaks even" in t.get_text() for t in fig.axes[0].texts)  # the marked band
    costs = figures.verify_costs([dense, moe])
    assert any("c(2) = 3.00" in t.get_text() for t in costs.axes[0].get_legend().get_texts())
    assert any("engine overhead" in t.get_text() for t in costs.axes[0].get_legend().get_texts())


def test_the_break_even_figure_names_curves_that_coincide():
    """Two models that pay at every draft length even when every draft is rejected draw the same a*(k) = 0 curve:
    the figure says so in its legend instead of hiding one (the report's figure checks pass)."""
    from specbench.report.figures.checks import figure_problems

    cheaper = [1.0, 0.9, 0.9, 0.9, 0.9]  # a verify cheaper than a plain step: a*(k) = 0
    fig = figures.break_even([_profile("dense", cheaper), _profile("moe", [1.0, 0.8, 0.85, 0.9, 0.95])], max_k=4)
    labels = [line.get_label() for line in fig.axes[0].lines]
    assert any("moe (fast), same points as dense (fast)" in label for label in labels), labels
    assert figure_problems(fig) == []


def _summary(**columns) -> pl.DataFrame:
    base = {
        "drafter": ["none", "none", "lookup", "suffix"],
        "policy": ["none", "A/A", "fixed:3", "auto"],
        "k": [0, 0, 3, None],
        "mean_k": [None, None, 3.0, 2.4],
        "prompts": [2, 2, 2, 2],
        "pairs": [0, 6, 6, 6],
        "speedup": [1.0, 1.01, 1.31, 1.4],
        "speedup_low": [None, 0.9, 0.8, 0.9],
        "speedup_high": [None, 1.1, 1.9, 1.6],
        "resampled": [None, "pair", "pair", "pair"],
        "verifies": [0, 0, 12, 0],
        "tokens_per_verify": [None, None, 2.5, None],
        "acceptance_rate": [None, None, 0.5, None],
        "all_equal_to_plain": [None, None, True, True],
    }
    return pl.DataFrame({**base, **columns})


def test_noisy_cells_are_inconclusive_and_only_a_clear_interval_pays_or_loses():
    text = verdicts.sweep(_summary(), "SmolLM2-135M", 32)
    assert "lookup, fixed:3, inconclusive at this sample (1.31x, 95 % interval over pairs 0.80-1.90 of 6 pairs)" in text
    assert "2 prompt(s) x 32 tokens" in text and "plain against plain (A/A) 1.01x [0.90-1.10]" in text
    clear = _summary(speedup_low=[None, 0.9, 1.1, 0.9], speedup_high=[None, 1.1, 1.5, 1.6])
    assert "lookup, fixed:3, pays (1.31x" in verdicts.sweep(clear, "m")
    slow = _summary(speedup=[1.0, 1.0, 0.7, 1.4], speedup_low=[None, 0.9, 0.6, 0.9], speedup_high=[None, 1.1, 0.8, 1.6])
    assert "lookup, fixed:3, loses (0.70x" in verdicts.sweep(slow, "m")
    # the machine drifted: plain against plain excludes 1, so no interval of a method is believed
    drifted = _summary(speedup_low=[None, 1.05, 1.1, 0.9], speedup_high=[None, 1.2, 1.5, 1.6])
    text = verdicts.sweep(drifted, "m")
    assert "inconclusive at this sample" in text and "drifted" in text and " pays " not in text
    # too few pairs for an interval, or single unpaired runs: inconclusive, never a word from the point
    few = _summary(pairs=[0, 2, 2, 2], speedup_low=[None] * 4, speedup_high=[None] * 4, speedup=[1.0, 1.0, 1.8, 1.0])
    assert "inconclusive at this sample (1.80x over 2 pair(s) of runs; an interval needs 6" in verdicts.sweep(few, "m")
    assert verdicts.speed(2.0, None, None).startswith("inconclusive at this sample (2.00x from single unpaired runs")
    assert verdicts.speed_word(0.5, 3.0) == verdicts.INCONCLUSIVE


def test_the_speed_statements_say_what_the_words_say():
    """``SpeedVerdict``: each page's statement carries the word its verdict text gives, for the quantity it names."""
    runs = pl.DataFrame({"drafter": ["lookup", "none"], "category": ["qa", "qa"], "temperature": [0.0] * 2})
    runs = runs.with_columns(verify_mode=pl.lit("exact"))
    clear = _summary(speedup_low=[None, 0.9, 1.1, 0.9], speedup_high=[None, 1.1, 1.5, 1.6])
    slow = _summary(speedup=[1.0, 1.0, 0.7, 1.4], speedup_low=[None, 0.9, 0.6, 0.9], speedup_high=[None, 1.1, 0.8, 1.6])
    drifted = _summary(speedup_low=[None, 1.05, 1.1, 0.9], speedup_high=[None, 1.2, 1.5, 1.6])
    few = _summary(pairs=[0, 2, 2, 2], speedup_low=[None] * 4, speedup_high=[None] * 4, speedup=[1.0, 1.0, 1.8, 1.0])
    for summary, word in ((clear, verdicts.PAYS), (slow, verdicts.LOSES), (drifted, INCONCLUSIVE), (few, INCONCLUSIVE)):
        (stated,) = verdicts.sweep_speeds(summary, runs, "m")
        assert f"lookup, fixed:3, {word} (" in verdicts.sweep(summary, "m")
        assert stated == verdicts.SpeedVerdict("m", "lookup", "fixed:3", "qa", 0.0, "exact", word, stated.speedup)
        (quick,) = verdicts.quickstart_speeds(summary, runs, "m")
        assert f"speculation {word} (" in verdicts.quickstart("m", summary, 32, True)
        assert (quick.kind, quick.word) == (OWN_PROMPT, word)
    # the kind a sweep's verdict says cannot pay is stated to lose there
    by_category = _summary(category=["qa"] * 4, verification_s=[None, None, 12.0, None])
    by_category = by_category.with_columns(plain_decode_s=pl.lit(1.0), plain_decode_tokens=pl.lit(4))
    assert "On qa (lookup, fixed:3) a verification yielded 2.50 tokens" in verdicts.sweep(clear, "m", 32, by_category)
    cannot = verdicts.sweep_speeds(clear, runs, "m", by_category)[1]
    assert (cannot.drafter, cannot.policy, cannot.kind, cannot.word) == ("lookup", "fixed:3", "qa", verdicts.LOSES)
    # a trace replay: the fastest drafter over the traces replayed
    overall = _trace_overall()
    (traced,) = verdicts.trace_speeds(overall, "m", ["tool", "chat"], "auto", "exact")
    assert "suffix, pays (" in verdicts.traces(overall, "m", 16, 24, "auto")
    assert traced == verdicts.SpeedVerdict("m", "suffix", "auto", "traces chat+tool", 0.0, "exact", verdicts.PAYS, 1.31)


def test_a_method_that_fell_back_to_plain_is_never_best():
    text = verdicts.sweep(_summary(), "m")
    assert "fastest method that drafted, lookup, fixed:3" in text  # not suffix auto's 1.40x of plain steps
    assert "Fell back to plain (never drafted): suffix, auto." in text
    stats = pl.DataFrame(
        {
            "drafter": ["none", "lookup"],
            "policy": ["A/A", "fixed:4"],
            "pairs": [6, 6],
            "speedup": [1.0, 1.3],
            "speedup_low": [0.9, 1.1],
            "speedup_high": [1.1, 1.5],
            "resampled": ["pair", "pair"],
            "verifies": [0, 0],
        }
    )
    quick = verdicts.quickstart("m", stats, 32, True)
    assert "fell back to plain decoding" in quick and "pays" not in quick
    rows = [
        {"method": "mlx-lm plain", "category": "overall", "drafter": "none", "speedup": 1.0},
        {"method": "lookup auto", "category": "overall", "drafter": "lookup", "speedup": 1.14,
         "acceptance_rate": float("nan"), "mean_accepted_tokens": 1.0, "prompts": 8},
        {"method": "suffix fixed:4", "category": "overall", "drafter": "suffix", "speedup": 1.05,
         "acceptance_rate": 0.4, "mean_accepted_tokens": 1.6, "prompts": 8, "speedup_low": 0.95,
         "speedup_high": 1.15, "policy": "fixed:4"},
    ]  # fmt: skip
    text = verdicts.bench(rows, "mlx-lm plain")
    assert text.startswith("Fastest method that drafted, suffix fixed:4: inconclusive at this sample (1.05x")
    assert "Fell back to plain (never drafted): lookup auto." in text
    traces = pl.DataFrame(
        {"method": ["plain", "suffix"], "speedup": [1.0, 1.6], "tokens_per_verify": [0.0, 0.0], "identical": [True] * 2}
    )
    assert "every drafter fell back to plain decoding" in verdicts.traces(traces, "m")


def test_no_verdict_rests_on_a_prediction_alone():
    assert "no verdict" in verdicts.batch_break_even({"dense": object()}, None, [0.5])
    grid = pl.DataFrame(
        {
            "model": ["dense", "dense"],
            "batch_size": [1, 4],
            "acceptance": [0.9, 0.9],
            "k": [4, 4],
            "measured": [1.2, 0.7],
            "predicted": [9.0, 9.0],  # at the nominal acceptance: not the one the verdict quotes
            "predicted_from_log": [1.5, 1.3],  # for the steps each run took
            "residual": [1.2 / 1.5 - 1, 0.7 / 1.3 - 1],
        }
    )
    text = verdicts.batch_break_even({"dense": object()}, grid, [0.9])
    assert "no speed verdict" in text and "pays" not in text
    assert "0.70-1.20x, below 1 in 1 of 2, against predictions of 1.30-1.50x" in text
    assert "Predicted above 1 but measured below: dense a = 0.9, k = 4, B = 4." in text


def test_a_grid_of_repeated_pairs_sets_its_residuals_against_the_noise_floor():
    from specbench.cost.predict import noise_floor

    def grid(residuals, runs):
        n = len(residuals)
        return pl.DataFrame(
            {
                "model": ["moe"] * n,
                "batch_size": [4] * n,
                "acceptance": [0.9] * n,
                "k": [2] * n,
                "measured": [1.0 + r for r in residuals],
                "predicted_from_log": [1.0] * n,
                "residual": residuals,
                "measured_runs": runs,
                "noise_floor": [noise_floor(r) for r in runs],
            }
        )

    scattered = [[0.8, 1.2]] * 8  # floor sqrt(2 / pi) 0.283 / sqrt(2) = 16 % per cell
    within = verdicts.batch_break_even({"moe": object()}, grid([0.15, -0.2] * 4, scattered), [0.9])
    assert "the median of 2 adjacent pairs each" in within
    assert "Mean |residual| 17.5% against 16.0%" in within and "within the noise" in within
    tight = [[0.99, 1.01]] * 8
    beyond = verdicts.batch_break_even({"moe": object()}, grid([0.15, -0.2] * 4, tight), [0.9])
    assert "beyond the noise: the predictor misses" in beyond
    single = verdicts.batch_break_even({"moe": object()}, grid([0.1, -0.1], [[1.1], [0.9]]), [0.9])
    assert "one plain and one speculative run each" in single and "noise" not in single  # no scatter: no floor


def test_key_results_carry_words_and_units():
    assert describe("smollm2-135m-moe a*(4)", None) == (
        "smollm2-135m-moe: break-even acceptance a*(4) for a draft of 4",
        "never breaks even",
    )
    label, value = describe("mean_abs_prediction_error", 0.436)
    assert "prediction error" in label and value == "44%"
    assert describe("lossless_tvd", 0.35)[0].startswith("losslessness: total variation distance")
    assert describe("dense c(2)", 3.04) == (
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
    dense_bytes = bandwidth.bytes_per_forward(dense)  # untied: the embedding table is gathered, not read whole
    assert dense_bytes == sum(v.nbytes for v in _leaves(dense.parameters())) - dense.model.embed_tokens.weight.nbytes
    args = moe.args
    experts = sum(layer.mlp.switch_mlp.gate_proj.weight.nbytes * 3 for layer in moe.model.layers)  # gate, up, down
    everything = sum(v.nbytes for v in _leaves(moe.parameters()))
    embed = moe.model.embed_tokens.weight.nbytes
    expected = everything - embed - experts + experts * args.num_experts_per_tok / args.num_experts
    assert abs(bandwidth.bytes_per_forward(moe) - expected) <= 8
    # a forward of w rows reads every dense weight once, and the experts its w tokens are expected to touch
    assert bandwidth.bytes_per_forward(dense, rows=9) == dense_bytes
    share = 1 - (1 - args.num_experts_per_tok / args.num_experts) ** 4
    assert abs(bandwidth.bytes_per_forward(moe, rows=4) - (expected - experts / 4 + experts * share)) <= 8
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


def test_trace_verdicts_name_their_sample_and_interval():
    # over several traces: the overall speedup, with its interval over traces where it has one
    overall = _trace_overall()
    text = verdicts.traces(overall, "m", 16, 24, "fixed:4")
    assert "the fastest drafter, suffix, pays (1.31x, 95 % interval over traces 1.12-1.52 of 8 traces)" in text
    assert "8 trace(s), 16 turn(s) x 24 tokens, fixed:4, greedy" in text
    one_trace = overall.with_columns(pl.lit(1).alias("traces"), pl.lit(None, pl.Float64).alias("speedup_low"))
    one = verdicts.traces(one_trace, "m", 2, 24, "fixed:4")
    assert "inconclusive at this sample (1.31x over 1 trace(s); an interval needs 6 traces)" in one


def test_figure_checks_find_missing_titles_labels_clipping_and_hidden_series():
    import matplotlib.pyplot as plt

    from specbench.report.figures.checks import figure_problems

    fig, ax = plt.subplots(figsize=(4, 3), constrained_layout=True)
    ax.plot([1, 2, 3], [1, 2, 3], label="suffix path")
    ax.plot([1, 2, 3], [1, 3, 2], label="suffix tree")
    ax.axhline(1.0, label="plain")
    ax.set(title="fine", xlabel="k", ylabel="tokens")
    assert figure_problems(fig) == []
    ax.plot([1, 2, 3], [1, 2, 3], label="lookup path")  # drawn over "suffix path"
    ax.set_title("")
    ax.set_ylabel("")
    problems = figure_problems(fig)
    assert "axes 1: no title" in problems and "axes 1: no y-axis label" in problems
    assert any("'suffix path' and 'lookup path' coincide" in p for p in problems)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(4, 3))  # no layout: a long label runs off the canvas
    ax.plot([1, 2], [1, 2])
    ax.set(title="t", xlabel="x", ylabel="a y-axis label far too long for a figure of this height, so it is cut")
    assert any("outside the canvas" in p for p in figure_problems(fig))
    plt.close(fig)


def test_pages_show_parameters_as_written_and_no_local_paths_or_progress(tmp_path):
    import nbformat
    from nbformat.v4 import new_code_cell, new_notebook, new_output

    from specbench.common.files import PROJECT_ROOT
    from specbench.report.runner import readable_notebook

    params = new_code_cell(f'# Parameters\nprompt = "angek\\xfcndigt"\noutput_dir = "{tmp_path}"')
    params.metadata["tags"] = ["injected-parameters"]
    work = new_code_cell("print(1)")
    work.outputs = [
        new_output("stream", name="stderr", text="\rsweep:  50%|#####     | 1/2"),
        new_output("stream", name="stderr", text="specbench: calibrating\n"),
        new_output("stream", name="stdout", text=f"read {PROJECT_ROOT}/specbench/assets and {tmp_path}/x.parquet\n"),
    ]
    nb = readable_notebook(new_notebook(cells=[params, work]), tmp_path)
    nbformat.validate(nb)
    assert "prompt = 'angekündigt'" in nb.cells[0].source and "output_dir = '.'" in nb.cells[0].source
    assert [o["name"] for o in nb.cells[1].outputs] == ["stdout", "stdout"]  # no progress bar, no red box
    assert nb.cells[1].outputs[1]["text"] == "read <specbench>/specbench/assets and ./x.parquet\n"


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


def test_batch_reference_contrast_reads_the_shipped_batch_profiles():
    """The H200's shipped c(w, B): the dense shape's a*(4, B) falls along the batch and the MoE's rises; the
    figure draws this machine's a*(k, B) beside them and passes the report's figure checks."""
    from specbench.cost.batch import BatchProfile
    from specbench.cost.reference import reference_profiles
    from specbench.report.figures.checks import figure_problems

    reference = reference_profiles()
    text = verdicts.batch_reference_contrast(reference, 0.0, 4)
    assert "dense falls from a*(4, 1) = 0.62 to a*(4, 32) = 0.03" in text
    assert "MoE rises from a*(4, 1) = 0.09 to a*(4, 32) = 0.65" in text
    assert "no batch profile 17 rows wide" in verdicts.batch_reference_contrast(reference, 0.0, 16)
    here = BatchProfile(
        model="tiny",
        device="cpu:test",
        offset=16,
        costs={1: [1.0, 1.5, 2.0], 2: [1.0, 1.2, 1.4]},
        plain_s={1: 0.01, 2: 0.015},
    )
    fig = figures.batch_beside_reference({"tiny": here}, reference, 0.0, [1, 2, 4])
    assert [line.get_label() for line in fig.axes[0].lines] == ["tiny, k = 1", "tiny, k = 2"]  # k = 4 too wide
    assert len(fig.axes[1].lines) == 6 and figure_problems(fig) == []  # dense and MoE at k = 1, 2, 4


def test_the_reference_ships_its_stacks_by_component_and_the_verdict_reads_them():
    """The H200's stacks (dense, MoE, hybrid) ship with the package: the verdict names each shape's deciding part
    and what set the pace there, and the figure draws all three with one legend that holds every part drawn."""
    from specbench.cost.components import PARTS, phase_stack
    from specbench.cost.reference import reference_profiles
    from specbench.report.figures.checks import figure_problems

    reference = reference_profiles()
    assert sorted(reference.components) == [
        "synthetic:qwen3-30b-a3b-4bit",
        "synthetic:qwen3-8b-4bit",
        "synthetic:qwen3.5-9b-4bit",
    ]
    assert all({r["part"] for r in rows} == set(PARTS) for rows in reference.components.values())
    text = verdicts.reference_stacks(reference)
    assert text.startswith(" On the NVIDIA H200 reference, verify cost by component: For synthetic:qwen3-8b-4bit")
    assert "synthetic:qwen3-30b-a3b-4bit, experts decides" in text
    assert "synthetic:qwen3.5-9b-4bit, recurrent decides" in text and "(host-bound" in text
    fig = figures.component_stack(reference.components, title="reference")
    assert not figure_problems(fig)
    legend = [t.get_text() for t in fig.axes[-1].get_legend().get_texts()]
    assert {"experts", "recurrent", "attention", "measured step"} <= set(legend)
    # counted by phase (each part's host work, the wait for the device apart): the shipped run measured host_s,
    # and its parts add up to every width's measured step within 10 % on each shape; rows without it are not drawn
    counted = {n: phase_stack(rows) for n, rows in reference.components.items()}
    assert all(rows and max(abs(r["error"]) for r in rows) <= 0.10 for rows in counted.values())
    assert "Counted by phase" in text
    dense = reference.components["synthetic:qwen3-8b-4bit"]
    assert phase_stack([{k: v for k, v in r.items() if k != "host_s"} for r in dense]) is None
    fig = figures.component_stack(reference.components, by_phase=True)
    assert not figure_problems(fig) and len(fig.axes) == 3 and "wait for the device apart" in fig._suptitle.get_text()
    assert {"wait", "experts", "measured step"} <= {t.get_text() for t in fig.axes[-1].get_legend().get_texts()}


def test_a_verification_costs_its_own_forward_not_the_whole_run():
    """verify_cost divides the verifications' own seconds by their count: a run of a 10 s prompt, 20 plain steps of
    1 s and one 3.7 s verification cost 3.7 plain steps a verification (not the run's 33.7 s of forwards)."""
    from specbench.core.log import StepLog, StepRecord

    records = [StepRecord(0, 0, "prefill", verify_s=10.0, emitted=1)]
    records += [StepRecord(i, i, "plain", verify_s=1.0, emitted=1) for i in range(1, 21)]
    records.append(StepRecord(21, 21, "verify", k_drafted=3, accepted=2, emitted=3, verify_width=4, verify_s=3.7))
    stats = StepLog(records).stats()
    assert stats["verify_s"] == 33.7 and stats["verification_s"] == 3.7
    row = {**stats, "plain_decode_s": 23.0, "plain_decode_tokens": 23}
    assert abs(verdicts.verify_cost(SummaryRow.of(row)) - 3.7) < 1e-9
    assert verdicts.verify_cost(SummaryRow.of({**row, "verification_s": None})) is None  # from before the column


def test_a_speed_verdict_states_its_intervals_level():
    from specbench.report.verdicts import speed

    assert "95 % interval over pairs 1.20-1.80 of 9 pairs" in speed(1.5, 1.2, 1.8, 9, "pair")
    sequential = speed(1.5, 1.2, 1.8, 9, "pair", level=1 - 0.05 / 3)  # a sequential rule of 3 looks
    assert "98.3 % interval over pairs" in sequential and "95 %" not in sequential


def test_replayed_logs_and_trees_are_said_per_drafter_in_order_of_appearance():
    from types import SimpleNamespace

    summary = pl.DataFrame(
        {
            "drafter": ["suffix", "lookup", "suffix", "lookup"],
            "store": ["a", "b", "c", "d"],
            "k": [4, 8, 2, 3],
            "accepted_per_verify": [1.5, 2.0, 1.7, None],
        }
    )
    text = verdicts.simulated_logs(SimpleNamespace(summary=summary, turns=5, traces=2))
    assert "suffix 1.70 accepted tokens per verification (store c, k = 2); lookup 2.00 " in text
    gain = pl.DataFrame(
        {"drafter": ["b", "a", "b"], "ratio": [1.2, 0.9, 0.8], "tree": [2.0, 1.0, 3.0], "path": [1.5, 1.1, 3.5]}
    )
    assert verdicts.tree_vs_path(gain).endswith(
        "b: the tree accepted more per verification in 1 of 2 cases (mean 2.50 vs 2.50 tokens for the path); "
        "a: the tree accepted more per verification in 0 of 1 cases (mean 1.00 vs 1.10 tokens for the path)."
    )


def test_the_rules_verdict_names_the_best_lossless_rule_and_the_lossy_rules_shift():
    summary = pl.DataFrame(
        {
            "temperature": [0.7, 0.7, 0.7, 1.0, 1.0],
            "acceptance": ["token", "block", "typical (lossy)", "token", "block"],
            "lossless": [True, True, False, True, True],
            "tokens_per_verify": [1.5, 1.7, None, 1.2, 1.3],
        }
    )
    shifts = pl.DataFrame(
        {
            "acceptance": ["token", "typical (lossy)"],
            "temperature": [0.7, 0.7],
            "tvd": [0.1, 0.3],
            "tvd_low": [0.05, 0.2],
            "tvd_high": [0.2, 0.4],
            "tvd_noise": [0.15, 0.15],
            "verdict": ["pass", "fail"],
        }
    )
    text = verdicts.acceptance_rules(summary, summary.filter(pl.col("acceptance") == "block"), shifts)
    assert "T = 0.7: block, 1.70 tokens per verification (token 1.50, typical (lossy) 0.00); T = 1: block" in text
    assert text.endswith(
        "typical (lossy) at T = 0.7 moves the token distribution by TVD 0.30 [0.20-0.40] (two samples of one "
        "distribution differ by up to 0.15 here; the histogram test says fail)."
    )
