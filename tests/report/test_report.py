"""Library side of notebooks and reports: capabilities, sweeps, rendering, figures, outputs, the
report runner (on small notebooks of its own) and the explorer, headless."""

from __future__ import annotations

import html
import json
from pathlib import Path

import matplotlib
import mlx.core as mx
import nbformat
import numpy as np
import polars as pl
import pytest
from conftest import ScriptedDrafter, build_tiny, plain_greedy
from nbformat.v4 import new_code_cell, new_notebook

from specbench import DraftPolicy, GenerateOptions, StepRecord, generate, speculative_generate
from specbench.bench import sweep, timing
from specbench.checks import lossless
from specbench.common.blas import blas_in_use
from specbench.inputs import capabilities as caps
from specbench.inputs.prompts import prompt_table, prompts_from
from specbench.models.synthetic import tiny_config
from specbench.report import Outputs, figures, render, verdicts
from specbench.report import runner as report
from specbench.report.index import write_index

matplotlib.use("Agg")


# -- a byte-level tokenizer for tiny models ------------------------------------------------------


def byte_tokenizer():
    """mlx-lm's TokenizerWrapper over a 256-token byte-level BPE without merges (no files needed)."""
    from mlx_lm.tokenizer_utils import TokenizerWrapper
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return TokenizerWrapper(PreTrainedTokenizerFast(tokenizer_object=tok))


@pytest.fixture(scope="module")
def text_model():
    return build_tiny("llama", seed=3, scale=2.0, vocab_size=256), byte_tokenizer()


class WrongAt(ScriptedDrafter):
    """A scripted drafter that is wrong at draft position ``bad`` (0-based) of every draft."""

    def __init__(self, truth, prompt_len, vocab, bad):
        super().__init__(truth, prompt_len, vocab, wrong_at=lambda step, i: i == bad)
        self.name = "scripted"


# -- capabilities --------------------------------------------------------------------------------


def test_capabilities_report_and_require(monkeypatch):
    found = caps.capabilities()
    assert set(found) == set(caps.CHECKS)
    assert found["bundled_prompts"].available
    with pytest.raises(ValueError, match="unknown capability"):
        caps.check("warp-drive")

    def missing():
        raise caps.MissingCapability("not built yet")

    monkeypatch.setitem(caps.CHECKS, "drafter:dream", missing)
    assert caps.check("drafter:dream") == caps.Capability("drafter:dream", False, "not built yet")


def test_usable_drafters_skips_what_the_model_lacks():
    model = build_tiny("llama")
    factories, skipped = caps.usable_drafters(["lookup", "mtp", "none"], model, "tiny-llama")
    assert factories["lookup"]().name == "lookup"
    assert factories["lookup"]() is not factories["lookup"]()  # fresh drafter per call
    assert factories["none"]() is None
    assert "mtp" in skipped and "MTP head" in skipped["mtp"]
    with pytest.raises(ValueError, match="unknown drafter"):
        caps.usable_drafters(["warp"], model)


# -- rendering -----------------------------------------------------------------------------------


def test_token_sources_follow_the_log(text_model):
    model, tokenizer = text_model
    prompt = tokenizer.encode("the cat sat on the mat. the cat")
    truth = plain_greedy(model, prompt, 20)
    drafter = WrongAt(truth, len(prompt), 256, bad=2)
    gen = speculative_generate(
        model, prompt, GenerateOptions(max_tokens=20), drafter=drafter, policy=DraftPolicy.fixed(3)
    )
    tokens = list(gen)
    assert tokens == truth
    sources = render.token_sources(gen)
    assert [t for t, _, _ in sources] == tokens
    expected = []
    for r in gen.log.records:
        if r.kind == "verify":
            expected += ["draft"] * r.accepted + ["bonus"] * (r.emitted - r.accepted)
        else:
            expected += ["plain"] * r.emitted
    assert [s for _, s, _ in sources] == expected
    # every full verify accepts the first two draft tokens and corrects the third
    full = [r for r in gen.log.records if r.kind == "verify" and r.k_drafted == 3]
    assert full and all(r.accepted == 2 for r in full)
    assert render.source_counts(gen)["draft"] == sum(r.accepted for r in gen.log.records if r.kind == "verify")
    page = render.coloured_html(gen, Letters())
    counts = render.source_counts(gen)
    for source in render.SOURCES:  # one span per token, plus one in the legend
        assert page.count(f"background:{render.SOURCE_COLOURS[source]}") == counts[source] + 1
    assert "accepted draft token" in page


class Letters:
    """A tokenizer whose token t decodes to one letter."""

    def decode(self, ids):
        return "".join(chr(97 + t % 26) for t in ids)


def test_token_pieces_join_to_the_decoded_text():
    tokenizer = byte_tokenizer()
    ids = tokenizer.encode("héllo <b>&</b> wörld")
    pieces = render.token_pieces(tokenizer, ids)
    assert "".join(pieces) == tokenizer.decode(ids)
    assert pieces.count("") == 2  # é and ö take two byte tokens each: shown on the second
    page = render.coloured_html([StepRecord(step=0, position=0, kind="plain", tokens=ids)], tokenizer)
    assert ">&lt;<" in page and ">&amp;<" in page and "<b>" not in page


# -- sweeps --------------------------------------------------------------------------------------


def test_run_sweep_measures_acceptance_per_position(text_model):
    model, tokenizer = text_model
    prompt = tokenizer.encode("one two three, one two three, one two")
    truth = plain_greedy(model, prompt, 16)
    result = sweep.run_sweep(
        model,
        tokenizer,
        [prompt],
        drafters=[],
        policies=["fixed:4"],
        max_tokens=16,
        progress=False,
        drafter_factories={"scripted": lambda: WrongAt(truth, len(prompt), 256, bad=2)},
        warmup_tokens=2,
    )
    runs = result.runs
    assert runs["drafter"].to_list() == ["none", "scripted"]
    # both runs started from one shared prefill of the prompt's prefix, and still decode as mlx-lm
    for run in (0, 1):
        emitted = [t for ts in result.steps.filter(pl.col("run") == run)["tokens"].to_list() for t in ts]
        assert emitted == truth
    assert runs.filter(pl.col("drafter") == "scripted")["equal_to_plain"].to_list() == [True]
    positions = result.per_position(["drafter", "policy"])
    rates = dict(zip(positions["position"].to_list(), positions["rate"].to_list()))
    assert rates[1] == 1.0 and rates[2] == 1.0 and rates[3] == 0.0
    assert 4 not in rates  # position 4 is never reached: position 3 always fails
    summary = result.summary()
    row = summary.filter(pl.col("drafter") == "scripted").row(0, named=True)
    verifies = runs.filter(pl.col("drafter") == "scripted")["verifies"][0]
    assert row["tokens_per_verify"] == pytest.approx((row["accepted"] + verifies) / verifies)
    assert row["all_equal_to_plain"] is True
    assert row["speedup"] == pytest.approx(
        (row["decode_tokens"] / row["decode_s"]) / (row["plain_decode_tokens"] / row["plain_decode_s"])
    )


def _ordered_sweep(text_model, monkeypatch, policies, pairs, label):
    """A paired sweep of one prompt with a scripted drafter, and the order its generations ran in: "P" for a plain
    run, ``label(policy)`` for a speculative one."""
    model, tokenizer = text_model
    prompt = tokenizer.encode("one two three, one two three, one two")
    truth = plain_greedy(model, prompt, 8)
    order = []
    plain_run, spec_run = timing.plain_generation, timing.speculative_generate
    monkeypatch.setattr(timing, "plain_generation", lambda *a, **k: order.append("P") or plain_run(*a, **k))
    monkeypatch.setattr(
        timing, "speculative_generate", lambda *a, **k: order.append(label(k["policy"])) or spec_run(*a, **k)
    )
    result = sweep.run_sweep(
        model,
        tokenizer,
        [prompt],
        drafters=[],
        policies=policies,
        max_tokens=8,
        progress=False,
        drafter_factories={"scripted": lambda: WrongAt(truth, len(prompt), 256, bad=2)},
        warmup_tokens=0,
        pairs=pairs,
    )
    return result, order


def test_paired_sweep_alternates_the_order_and_records_an_aa_cell(text_model, monkeypatch):
    result, order = _ordered_sweep(text_model, monkeypatch, ["fixed:2"], 3, lambda policy: "M")
    assert "".join(order) == "P" + "PM" + "MP" + "PM"  # the reference run, then pairs in alternating order
    runs = result.runs
    method = runs.filter(pl.col("drafter") == "scripted")
    assert method["pair"].to_list() == [0, 1, 2] and method["equal_to_plain"].all()
    aa = runs.filter(pl.col("policy") == sweep.AA_POLICY)
    assert aa.height == 3 and aa["drafter"].unique().to_list() == ["none"]
    # each method row's baseline is its own pair's plain run, and the A/A rows chain the plain runs
    plain_rows = runs.filter(pl.col("drafter") == "none")
    assert method["plain_decode_s"].to_list() == aa["decode_s"].to_list()
    assert aa["plain_decode_s"].to_list() == plain_rows["decode_s"].to_list()[:3]
    assert set(result.steps["run"].unique().to_list()) == {0, int(method["run"][0])}  # logs of the first pair only
    summary = result.summary()
    row = summary.filter(pl.col("drafter") == "scripted").row(0, named=True)
    assert row["pairs"] == 3 and row["prompts"] == 1 and row["speedup_low"] is None  # 3 pairs: no interval


def _sequential_sweep(text_model, monkeypatch, **options):
    """A sweep whose clock is scripted: drafter "good" always takes half a plain run's time, "even" alternately 0.8
    and 1.25 of it (a ratio whose interval keeps covering 1)."""
    model, tokenizer = text_model
    prompt = tokenizer.encode("one two three, one two three, one two")
    truth = plain_greedy(model, prompt, 8)
    spec_run = timing.speculative_generate
    tags: dict[int, tuple[object, str]] = {}  # each generation kept, so that no later one reuses its id
    calls = {"even": 0}

    def tagged(*a, **k):
        gen = spec_run(*a, **k)
        tags[id(gen)] = (gen, k["drafter"].name)
        return gen

    def clock(make):
        gen = make()
        tokens = list(gen)
        name = tags.get(id(gen), (None, None))[1]
        if name == "even":
            calls["even"] += 1
        seconds = {None: 1.0, "good": 0.5, "even": (0.8, 1.25)[calls["even"] % 2]}[name]
        return timing.Clocked(gen, tokens, 0.0, seconds, seconds)

    class Named(WrongAt):
        def __init__(self, name):
            super().__init__(truth, len(prompt), 256, bad=2)
            self.name = name

    monkeypatch.setattr(timing, "speculative_generate", tagged)
    monkeypatch.setattr(timing, "clocked", clock)
    return sweep.run_sweep(
        model,
        tokenizer,
        [prompt],
        drafters=[],
        policies=["fixed:2"],
        max_tokens=8,
        progress=False,
        drafter_factories={"good": lambda: Named("good"), "even": lambda: Named("even")},
        warmup_tokens=0,
        **options,
    )


def test_sequential_sweep_adds_pairs_to_undecided_groups_only(text_model, monkeypatch):
    result = _sequential_sweep(text_model, monkeypatch, pairs=6, max_pairs=9)
    runs = result.runs
    pairs = {d: runs.filter(pl.col("drafter") == d)["pair"].to_list() for d in ("good", "even")}
    assert pairs == {"good": list(range(6)), "even": list(range(9))}  # good decided at the first look
    assert runs["looks"].unique().to_list() == [4]  # 9 - 6 + 1 looks, fixed before the run
    summary = result.summary().filter(pl.col("drafter") != "none")
    good, even = (summary.filter(pl.col("drafter") == d).row(0, named=True) for d in ("good", "even"))
    assert good["level"] == even["level"] == pytest.approx(1 - 0.05 / 4)
    assert good["speedup_low"] == pytest.approx(2.0) and even["speedup_low"] < 1.0 < even["speedup_high"]
    # A/A rows chain consecutive plain runs: one per block of the first stage (shared by both methods); a round's
    # one block has none
    assert even["pairs"] == 9 and runs.filter(pl.col("policy") == sweep.AA_POLICY).height == 6


def test_paired_sweep_shares_each_blocks_plain_run_in_mirrored_order(text_model, monkeypatch):
    policies = ["fixed:1", "fixed:2", "fixed:3"]
    result, order = _ordered_sweep(text_model, monkeypatch, policies, 2, lambda policy: policy.name[-1])
    # the reference run, then blocks: plain first and the methods, then the methods reversed and plain last
    assert "".join(order) == "P" + "P123" + "321P"
    runs = result.runs
    plain = runs.filter(pl.col("drafter") == "none")
    for pair in (0, 1):
        method = runs.filter((pl.col("drafter") == "scripted") & (pl.col("pair") == pair))
        block_plain = plain.filter((pl.col("policy") == sweep.AA_POLICY) & (pl.col("pair") == pair))
        assert method.height == 3 and method["equal_to_plain"].all()
        assert method["plain_decode_s"].unique().to_list() == block_plain["decode_s"].to_list()


def test_sequential_sweep_stops_at_its_time_budget(text_model, monkeypatch):
    runs = _sequential_sweep(text_model, monkeypatch, pairs=6, max_pairs=9, time_budget_s=1e-9).runs
    assert runs.filter(pl.col("drafter") == "even")["pair"].max() == 5  # no round fits: the first stage only


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"pairs": 0, "max_pairs": 4}, "max_pairs"),
        ({"pairs": 3, "max_pairs": 2}, "max_pairs"),
        ({"pairs": 2, "max_pairs": 4, "time_budget_s": 0}, "time_budget_s"),
    ],
)
def test_sequential_sweep_refuses_a_rule_it_cannot_run(text_model, options, message):
    model, tokenizer = text_model
    with pytest.raises(ValueError, match=message):
        sweep.run_sweep(model, tokenizer, [[1, 2, 3]], drafters=["lookup"], progress=False, **options)


def test_prefix_cache_copies_are_independent(text_model):
    model, tokenizer = text_model
    prompt = tokenizer.encode("a prompt to prefill once")
    prefix = timing.prefix_cache(model, prompt)
    assert prefix[0].offset == len(prompt) - 1
    first = generate(model, prompt, GenerateOptions(max_tokens=5), prompt_cache=timing.cache_copy(prefix))
    second = generate(model, prompt, GenerateOptions(max_tokens=5), prompt_cache=timing.cache_copy(prefix))
    assert list(first) == list(second) == plain_greedy(model, prompt, 5)
    assert first.stats()["cached_prompt_tokens"] == len(prompt) - 1 and prefix[0].offset == len(prompt) - 1
    needs_hidden = type("D", (), {"needs_hidden": True})()
    assert timing.cache_copy(prefix, needs_hidden) is None and timing.prefix_cache(model, prompt[:1]) is None


def test_run_sweep_skips_unusable_drafters_and_checks_policies(text_model):
    model, tokenizer = text_model
    prompt = tokenizer.encode("abc abc abc")
    with pytest.raises(ValueError, match="unknown policy"):
        sweep.run_sweep(model, tokenizer, [prompt], ["lookup"], ["often:3"], progress=False)
    result = sweep.run_sweep(
        model,
        tokenizer,
        [prompt],
        ["lookup", "mtp"],
        ["fixed:2"],
        max_tokens=6,
        temperatures=[0.0, 0.8],
        progress=False,
        warmup_tokens=0,
    )
    assert "mtp" in result.skipped
    assert len(result.runs) == 4  # (plain + lookup) x 2 temperatures
    sampled = result.runs.filter(pl.col("temperature") > 0)
    assert sampled["equal_to_plain"].null_count() == 2  # not compared when sampling (nor plain with itself)


def test_a_sweep_calibrates_only_the_widths_its_runs_can_verify(text_model, fresh_calibrations, monkeypatch):
    """fixed:128 over 4 tokens calibrates exact widths 2..4 up front (a draft of at most 3), not 2..129."""
    model, tokenizer = text_model
    calibrated: list[list[int]] = []
    monkeypatch.setattr(sweep, "calibrate", lambda model, widths, **kwargs: calibrated.append(list(widths)))
    prompt = tokenizer.encode("abc abc abc")
    result = sweep.run_sweep(
        model, tokenizer, [prompt], ["lookup"], ["fixed:128"], max_tokens=4, progress=False, warmup_tokens=1
    )
    assert calibrated == [[2, 3, 4]]
    assert result.runs["equal_to_plain"].drop_nulls().to_list() == [True]


def test_summarize_sweep_is_a_ratio_of_sums():
    runs = pl.DataFrame(
        {
            "drafter": ["a", "a"],
            "policy": ["fixed:2", "fixed:2"],
            "decode_tokens": [10, 30],
            "decode_s": [1.0, 1.0],
            "plain_decode_tokens": [10, 10],
            "plain_decode_s": [2.0, 2.0],
            "steps": [5, 10],
            "verifies": [4, 8],
            "drafted": [8, 16],
            "accepted": [4, 12],
            "equal_to_plain": [True, False],
        }
    )
    row = sweep.summarize_sweep(runs).row(0, named=True)
    assert row["speedup"] == pytest.approx((40 / 2.0) / (20 / 4.0))
    assert row["acceptance_rate"] == pytest.approx(16 / 24)
    assert row["mean_accepted_tokens"] == pytest.approx(40 / 15)
    assert row["all_equal_to_plain"] is False


def test_sweep_policies():
    assert [p.name for p in sweep.sweep_policies(["fixed", "auto", "adaptive"], [1, 4])] == [
        "fixed:1",
        "fixed:4",
        "auto",
        "adaptive:1",
        "adaptive:4",
    ]
    with pytest.raises(ValueError, match="unknown policy"):
        sweep.sweep_policies(["greedy"], [1])


def test_histogram_test_separates_distributions():
    rng = np.random.default_rng(0)
    same_a = rng.integers(0, 5, size=(30, 6)).tolist()
    same_b = rng.integers(0, 5, size=(30, 6)).tolist()
    shifted = rng.integers(3, 8, size=(30, 6)).tolist()
    _, p_same, tvd_same = lossless.histogram_test(same_a, same_b, permutations=500)
    _, p_diff, tvd_diff = lossless.histogram_test(same_a, shifted, permutations=500)
    assert p_same > 0.05 and p_diff < 0.01
    assert tvd_diff > tvd_same


def test_losslessness_check_counts_every_sample(text_model):
    model, tokenizer = text_model
    prompt = tokenizer.encode("ab ab ab ab ab")
    check = lossless.losslessness_check(
        model,
        tokenizer,
        prompt,
        "lookup",
        "fixed:3",
        temperature=1.0,
        samples=5,
        max_tokens=4,
        top=5,
        permutations=50,
        progress=False,
    )
    assert check.counts["plain"].sum() == 20 and check.counts["speculative"].sum() == 20
    assert len(check.plain_sequences) == len(check.speculative_sequences) == 5
    assert 0 < check.p_value <= 1 and 0 <= check.tvd <= 1
    # Its power: 5 samples x 4 tokens cannot exercise the acceptance rule: inconclusive, never a pass.
    assert check.accepted_drafts <= check.drafted and sum(map(len, check.plain_sequences)) == 20
    assert check.verdict in ("inconclusive", "fail") and check.verdict != "pass"
    assert check.min_detectable_tvd == pytest.approx(lossless.min_detectable_tvd(20, 20))
    text = check.describe()
    assert text.startswith(check.verdict) and f"{check.accepted_drafts} of {check.drafted} drafted" in text
    assert "detectable TVD >=" in text
    figures.token_histograms(check)
    with pytest.raises(ValueError, match="temperature > 0"):
        lossless.losslessness_check(model, tokenizer, prompt, temperature=0.0)
    with pytest.raises(ValueError, match="temperature > 0"):
        lossless.losslessness_check(model, tokenizer, prompt, temperature=float("nan"))


def test_lossless_verdict_states_its_power():
    # A large p-value is a pass only with enough accepted drafts and well-filled histograms.
    assert lossless.lossless_verdict(1.0, 0, 1.0)[0] == "inconclusive"
    verdict, reason = lossless.lossless_verdict(0.9, 19, 1.0)
    assert verdict == "inconclusive" and "only 19 draft tokens were accepted" in reason
    verdict, reason = lossless.lossless_verdict(0.9, 200, 0.2)
    assert verdict == "inconclusive" and "expected counts too small" in reason
    assert lossless.lossless_verdict(0.9, 200, 0.9)[0] == "pass"
    assert lossless.lossless_verdict(0.001, 0, 0.0)[0] == "fail"  # a permutation test's small p stands
    # Minimum detectable TVD: (z_0.975 + z_0.8) * sqrt(2 / n) / 2, shrinking as 1/sqrt(n).
    assert lossless.min_detectable_tvd(256, 256) == pytest.approx(2.8016 * (2 / 256) ** 0.5 / 2, rel=1e-3)
    assert lossless.min_detectable_tvd(1024, 1024) == pytest.approx(lossless.min_detectable_tvd(256, 256) / 2)
    assert lossless.min_detectable_tvd(0, 10) == float("inf")
    # Well filled: tokens whose expected count per sampler is >= 5.
    assert lossless.well_filled_share([[1] * 10], [[1] * 10]) == 1.0
    assert lossless.well_filled_share([[1, 2, 3, 4]], [[5, 6, 7, 8]]) == 0.0
    assert lossless.well_filled_share([[1] * 10 + [2]], [[1] * 10 + [3]]) == pytest.approx(20 / 22)


# -- figures and outputs -------------------------------------------------------------------------


def _labelled(fig):
    """Every panel with data has a y label; x labels may be shared with the panel below."""
    drawn = [ax for ax in fig.axes if ax.has_data()]
    assert drawn and all(ax.get_ylabel() for ax in drawn)
    assert any(ax.get_xlabel() for ax in drawn)
    assert any(ax.get_title() for ax in fig.axes) or fig._suptitle is not None


def test_figures_draw_sweep_results(text_model, tmp_path):
    model, tokenizer = text_model
    prompt = tokenizer.encode("one two three, one two three, one two")
    result = sweep.run_sweep(
        model,
        tokenizer,
        [prompt],
        ["lookup"],
        ["fixed:1", "fixed:3", "auto"],
        max_tokens=16,  # enough verifications per draft position for the per-position panel (3)
        temperatures=[0.0, 1.0],
        progress=False,
        warmup_tokens=0,
    )
    summary = result.summary(["drafter", "policy"])
    for fig in (
        figures.speedup_vs_k(summary),
        figures.accepted_vs_k(summary),
        figures.per_position(result.per_position()),
        figures.category_speedups(
            sweep.best_per_group(result.summary(["category", "drafter", "policy"]), ["category", "drafter"])
        ),
        figures.acceptance_vs_temperature(result.summary(["drafter", "policy", "temperature"])),
        figures.step_timeline(result.steps.filter(pl.col("run") == 1)),
    ):
        _labelled(fig)
    lines = figures.speedup_vs_k(summary).axes[0].get_lines()
    assert any(line.get_color() == figures.drafter_colour("lookup") for line in lines)
    png = figures.save_figure(figures.speedup_vs_k(summary), tmp_path / "speedup", svg=True)
    assert png == tmp_path / "speedup.png"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["speedup.png", "speedup.svg"]
    assert png.read_bytes()[:4] == b"\x89PNG" and b"<svg" in png.with_suffix(".svg").read_bytes()[:400]


def test_trace_figures():
    turns = pl.DataFrame(
        {
            "trace": ["t"] * 4,
            "turn": [0, 0, 1, 1],
            "method": ["plain", "suffix"] * 2,
            "decode_tokens": [9, 9, 9, 9],
            "steps": [9, 5, 9, 3],
            "verifies": [0, 4, 0, 3],
            "tokens_per_verify": [0.0, 2.0, 0.0, 3.0],
            "speedup": [1.0, 1.4, 1.0, 2.1],
        }
    )
    rows = sweep.trace_turns([type("R", (), {"turns": turns})()])
    assert rows.filter(pl.col("drafter") == "suffix")["saved"].to_list() == [4, 6]
    assert rows.filter(pl.col("drafter") == "none")["tokens_per_verify"].null_count() == 2
    _labelled(figures.per_turn(rows))
    fig = figures.cumulative_saved(rows)
    assert list(fig.axes[0].get_lines()[0].get_ydata()) == [4, 10]


def test_one_colour_scheme_for_drafters_and_models():
    assert figures.drafter_colour("lookup") == figures.COLOURS["lookup"] == figures.DRAFTER_COLOURS["lookup"]
    assert figures.drafter_colour("none") == figures.drafter_colour("plain")
    assert figures.drafter_colour("my-drafter") == figures.drafter_colour("my-drafter")  # a stable spare colour
    assert figures.drafter_order(["x", "suffix", "lookup"]) == ["lookup", "suffix", "x"]
    assert [figures.model_family(n) for n in ("qwen3-8b", "qwen3-30b-a3b", "qwen3-next-80b-a3b", "qwen3.5-4b")] == [
        "dense",
        "moe",
        "hybrid-moe",
        "hybrid",
    ]
    palette = figures.model_colours(["qwen3-8b", "qwen3-30b-a3b", "llama-8b"])
    assert palette["qwen3-8b"] == figures.COLOURS["dense"] and palette["qwen3-30b-a3b"] == figures.COLOURS["moe"]
    assert len(set(palette.values())) == 3  # a second dense model takes a spare colour


def test_headlines():
    summary = pl.DataFrame(
        {
            "drafter": ["none", "lookup", "suffix"],
            "policy": ["none", "fixed:2", "auto"],
            "speedup": [1.0, 1.3, 1.6],
            "all_equal_to_plain": [None, True, False],
        }
    )
    assert verdicts.sweep_headline(summary) == {
        "best": "suffix auto",
        "best_speedup": 1.6,
        "outputs_equal_to_plain": False,
    }
    traces = pl.DataFrame(
        {
            "method": ["plain", "suffix"],
            "identical": [True, True],
            "speedup": [1.0, 2.0],
            "tokens_per_verify": [0.0, 3.5],
        }
    )
    assert verdicts.trace_headline(traces) == {"identical": True, "suffix speedup": 2.0, "suffix tokens/verify": 3.5}


def test_outputs_write_figures_logs_tables_and_summary(tmp_path, text_model, monkeypatch):
    model, tokenizer = text_model
    out = Outputs(tmp_path, "demo")
    gen = generate(model, tokenizer.encode("hi"), GenerateOptions(max_tokens=3))
    list(gen)
    out.figure(figures.step_timeline(gen), "steps")
    out.log(gen.log, "plain")
    out.table(pl.DataFrame({"a": [1]}), "numbers")
    out.summary(tokens=3, never=float("nan"))
    out.skip("mtp section", "no head")
    monkeypatch.setitem(caps.CHECKS, "drafter:dream", lambda: (_ for _ in ()).throw(caps.MissingCapability("not yet")))
    assert out.needs("bundled_prompts", section="prompts section")
    assert not out.needs("bundled_prompts", "drafter:dream", section="dream section")
    data = json.loads((tmp_path / "demo" / "summary.json").read_text())
    assert data["values"] == {"tokens": 3, "never": None}
    assert data["skipped"] == {"mtp section": "no head", "dream section": "drafter:dream is not available: not yet"}
    assert data["figures"] == ["demo/figures/steps.png"] and (tmp_path / "demo/figures/steps.svg").exists()
    assert pl.read_parquet(tmp_path / data["logs"][0])["kind"].to_list()[0] == "prefill"
    silent = Outputs("", "demo")
    silent.figure(figures.step_timeline(gen), "steps")
    assert silent.figures == [] and silent.log(gen.log, "x") is None


# -- parameters and the runner -------------------------------------------------------------------


def _notebook(path: Path, parameters: str, body: str) -> None:
    cell = new_code_cell(parameters + '\noutput_dir = ""\nprogress = True')
    cell.metadata["tags"] = ["parameters"]
    nb = new_notebook(
        cells=[cell, new_code_cell(body)],
        metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
    )
    nbformat.write(nb, str(path))


def test_unknown_parameters_are_one_clear_error(tmp_path):
    _notebook(tmp_path / "quickstart.ipynb", 'model = "m"\nmax_tokens = 12\ndrafters = ["lookup"]\npairs = 2', "pass")
    names = ["quickstart"]
    known = r"unknown parameter\(s\) 'max_tokns'.*Known parameters: drafters, max_tokens, model, pairs"
    with pytest.raises(ValueError, match=known):
        report.resolve_parameters("quick", {"max_tokns": "3"}, names, tmp_path)
    with pytest.raises(ValueError, match="set by the report"):
        report.resolve_parameters("quick", {"output_dir": "x"}, names, tmp_path)
    with pytest.raises(ValueError, match="unknown profile"):
        report.resolve_parameters("huge", {}, names, tmp_path)
    overrides = {"max_tokens": "5", "quickstart.drafters": "lookup,suffix"}
    got = report.resolve_parameters("quick", overrides, names, tmp_path)
    assert got["quickstart"]["max_tokens"] == 5 and got["quickstart"]["drafters"] == ["lookup", "suffix"]
    assert got["quickstart"]["model"] == report.PROFILES["quick"]["quickstart"]["model"]
    with pytest.raises(ValueError, match="expected an integer"):
        report.resolve_parameters("quick", {"max_tokens": "lots"}, names, tmp_path)
    with pytest.raises(ValueError, match="key=value"):
        report.parse_assignments(["max_tokens"])


def test_run_report_keeps_failures_and_resumes(tmp_path):
    notebooks = tmp_path / "nb"
    notebooks.mkdir()
    _notebook(
        notebooks / "quickstart.ipynb",
        'model = "m"\nmax_tokens = 12\npairs = 2',
        (
            "import matplotlib.pyplot as plt\nfrom specbench.report import Outputs\n"
            "out = Outputs(output_dir, 'quickstart')\nfig, ax = plt.subplots()\nax.plot([1, 2], [max_tokens, 3])\n"
            "ax.set_title('t'); ax.set_xlabel('x'); ax.set_ylabel('y')\n"
            "out.figure(fig, 'line')\nout.summary(value=max_tokens, speedup=0.5)\nout.verdict(f'{max_tokens} tokens')"
        ),
    )
    _notebook(
        notebooks / "explorer.ipynb",
        'model = "m"\nk = 3\ngrid_draft_lengths = [1]',
        "raise RuntimeError('broken on purpose')",
    )
    out = tmp_path / "report"
    first = report.run_report(
        "quick", out, {"quickstart.max_tokens": "7"}, ["quickstart", "explorer"], notebooks=notebooks, progress=False
    )
    assert {r.notebook: r.status for r in first.results} == {"quickstart": "done", "explorer": "failed"}
    assert "broken on purpose" in report.read_status(out, "explorer")["error"]
    assert (out / "explorer.ipynb").exists() and (out / "explorer.html").exists()
    assert (out / "quickstart" / "figures" / "line.png").exists() and (out / "quickstart.html").exists()
    page = (out / "index.html").read_text()
    assert 'href="quickstart.html"' in page and 'class="failed"' in page and "broken on purpose" in page
    assert "quickstart/figures/line.png" in page and 'value: <span class="v">7</span>' in page
    assert "decode speedup over plain decoding" in page and ">0.50x<" in page  # key results in words, with units
    verdicts = page[page.index("<h2>Verdicts</h2>") : page.index("<table")]
    assert "7 tokens" in verdicts and "failed: RuntimeError: broken on purpose" in verdicts
    if mx.default_device().type == mx.DeviceType.cpu:  # the BLAS the CPU measured on, in the page's head
        head = page[: page.index("<h2>Verdicts</h2>")]
        assert "blas: " in head and html.escape(blas_in_use()) in head
    second = report.run_report(
        "quick", out, {"quickstart.max_tokens": "7"}, ["quickstart", "explorer"], notebooks=notebooks, progress=False
    )
    assert {r.notebook: r.status for r in second.results} == {"quickstart": "skipped", "explorer": "failed"}
    third = report.run_report(
        "quick", out, {"quickstart.max_tokens": "8"}, ["quickstart"], notebooks=notebooks, progress=False
    )
    assert third.results[0].status == "done"  # parameters changed: run again
    assert json.loads((out / "quickstart" / "summary.json").read_text())["values"] == {"value": 8, "speedup": 0.5}


def test_resume_reruns_notebooks_whose_outputs_are_gone_or_that_were_interrupted(tmp_path):
    notebooks = tmp_path / "nb"
    notebooks.mkdir()
    _notebook(
        notebooks / "quickstart.ipynb",
        'model = "m"\nmax_tokens = 12\npairs = 2',
        (
            "import matplotlib.pyplot as plt\nimport polars as pl\nfrom specbench.report import Outputs\n"
            "out = Outputs(output_dir, 'quickstart')\nfig, ax = plt.subplots()\nax.plot([1, 2])\n"
            "out.figure(fig, 'line')\nout.table(pl.DataFrame({'a': [1]}), 'numbers')\nout.summary(value=max_tokens)"
        ),
    )
    out = tmp_path / "report"
    kwargs = dict(only=["quickstart"], notebooks=notebooks, progress=False)
    assert report.run_report("quick", out, **kwargs).results[0].status == "done"
    status = report.read_status(out, "quickstart")
    assert {"quickstart.ipynb", "quickstart.html", "quickstart/figures/line.png", "quickstart/figures/line.svg"} <= set(
        status["outputs"]
    ) and "quickstart/tables/numbers.parquet" in status["outputs"]
    assert report.missing_outputs(out, "quickstart", status) == []
    assert report.run_report("quick", out, **kwargs).results[0].status == "skipped"
    for gone in ("quickstart/tables/numbers.parquet", "quickstart.html"):
        (out / gone).unlink()
        assert report.missing_outputs(out, "quickstart", report.read_status(out, "quickstart")) == [gone]
        assert report.run_report("quick", out, **kwargs).results[0].status == "done"
        assert (out / gone).exists()
    # A run killed mid-notebook leaves its status "running": the index shows it interrupted, a rerun runs it.
    report.write_status(out, "quickstart", {**status, "status": "running", "pid": 2**22 + 12345})
    write_index(out, report.NOTEBOOKS)
    page = (out / "index.html").read_text()
    assert 'class="interrupted">interrupted<' in page and "stopped before it finished" in page
    assert report.run_report("quick", out, **kwargs).results[0].status == "done"
    assert 'class="done"' in (out / "index.html").read_text()


# -- explorer ------------------------------------------------------------------------------------


def test_explorer_builds_and_a_run_updates_it(text_model):
    import ipywidgets

    from specbench.report.explorer import Explorer

    model, tokenizer = text_model
    app = Explorer(
        models={"tiny": (model, tokenizer)},
        drafters=["lookup", "mtp", "none"],
        prompt="la la la la",
        policy="fixed",
        k=3,
        max_tokens=12,
        refresh_s=0.0,
    )
    assert isinstance(app.widget, ipywidgets.VBox)
    assert app.draft_policy().name == "fixed:3"
    app.chat.value = False
    gen = app.button.click() or app.generation
    assert gen is not None and len(gen.tokens) == 12
    assert gen.log.records[1].policy == "fixed:3"
    assert "<span" in app.text.value and "tokens" in app.stats.value and "done: 12 tokens" in app.status.value
    assert app.figure is not None and app.figure.axes[0].has_data()
    assert bytes(app.plot.value).startswith(b"\x89PNG")  # drawn into an image widget, not an Output widget
    app.drafter.value = "mtp"
    assert app.run() is None and "not available" in app.status.value
    app.drafter.value, app.temperature.value = "none", 0.7
    plain = app.run()
    assert plain.stats()["verifies"] == 0 and len(plain.tokens) == 12
    app.drafter.value, app.verify.value = "lookup", "fast"
    assert app.run().options.verify_mode == "fast"
    with pytest.raises(ValueError, match="policy must be one of"):
        Explorer(models={"tiny": (model, tokenizer)}, policy="sometimes")
    with pytest.raises(ValueError, match="verify must be"):
        Explorer(models={"tiny": (model, tokenizer)}, verify="maybe")


# -- models and prompts for notebooks ------------------------------------------------------------


def test_tiny_config_keeps_architecture_and_vocabulary():
    llama = {
        "model_type": "llama",
        "hidden_size": 576,
        "intermediate_size": 1536,
        "num_hidden_layers": 30,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "vocab_size": 49152,
        "tie_word_embeddings": True,
    }
    small = tiny_config(llama)
    assert small["vocab_size"] == 49152 and small["model_type"] == "llama" and small["tie_word_embeddings"]
    assert (small["hidden_size"], small["num_hidden_layers"], small["num_attention_heads"]) == (64, 2, 4)
    assert "head_dim" not in small and "num_experts" not in small
    hybrid = {
        "model_type": "qwen3_5",
        "text_config": {
            "hidden_size": 4096,
            "num_hidden_layers": 32,
            "num_experts": 256,
            "num_experts_per_tok": 8,
            "full_attention_interval": 4,
        },
    }
    text = tiny_config(hybrid)["text_config"]
    assert text["num_experts"] == 8 and text["num_experts_per_tok"] == 2 and text["num_hidden_layers"] == 4


def test_prompts_from_texts_and_files(tmp_path):
    tokenizer = byte_tokenizer()
    prompts = prompts_from(["short", "a much longer prompt"], tokenizer, max_prompt_tokens=10)
    assert [p.text for p in prompts] == ["short"] and prompts[0].ids == tokenizer.encode("short")
    questions = tmp_path / "question.jsonl"
    questions.write_text(
        '{"question_id": 1, "category": "qa", "turns": ["Why?", "And then?"]}\n'
        '{"question_id": 2, "category": "rag", "turns": ["Where?"]}\n'
    )
    prompts = prompts_from(questions, tokenizer, categories=["qa"])
    assert [(p.id, p.category, p.text) for p in prompts] == [("1", "qa", "Why?")]
    assert prompt_table(prompts)["tokens"].to_list() == [4]
    with pytest.raises(ValueError, match="no prompt has at most"):
        prompts_from(["long prompt"], tokenizer, max_prompt_tokens=2)
    with pytest.raises(ValueError, match="need a tokenizer"):
        prompts_from(["x"], None)
    with pytest.raises(FileNotFoundError):
        prompts_from(tmp_path / "missing.jsonl", tokenizer)


def test_report_names_the_notebooks_folder_it_lacks(tmp_path, capsys):
    from specbench.cli import main

    code = main(["report", "--profile", "quick", "--notebooks", str(tmp_path), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and str(tmp_path) in err and "--notebooks DIR" in err
    assert not (tmp_path / "out").exists()  # nothing written half


def test_per_position_draws_rates_of_zero_and_one():
    """Every draft accepted (or none) at some positions: the Wilson interval's rounding must not make an error bar
    negative (matplotlib refuses those)."""
    reached = np.arange(1, 41)
    frame = pl.DataFrame(
        {
            "drafter": ["lookup"] * 40 + ["suffix"] * 40,
            "policy": ["fixed:3"] * 80,
            "position": np.concatenate([reached, reached]),
            "reached": np.concatenate([reached, reached]) + 3,
            "accepted": np.concatenate([reached + 3, np.zeros(40, dtype=int)]),
        }
    ).with_columns((pl.col("accepted") / pl.col("reached")).alias("rate"))
    fig = figures.per_position(frame)
    assert fig.axes[0].lines  # drawn


def test_losslessness_check_grows_its_sample_until_it_can_conclude(text_model):
    """``max_samples``: an inconclusive check samples as many again (new seeds for both samplers, the first
    samples unchanged) until it concludes or reaches the cap; bad caps are refused before any sampling."""
    model, tokenizer = text_model
    prompt = tokenizer.encode("ab ab ab ab ab")
    settings = dict(temperature=1.0, max_tokens=4, top=5, permutations=50, progress=False)
    small = lossless.losslessness_check(model, tokenizer, prompt, "lookup", "fixed:3", samples=3, **settings)
    assert small.verdict == "inconclusive"  # 3 x 4 tokens: too few accepted drafts
    grown = lossless.losslessness_check(
        model, tokenizer, prompt, "lookup", "fixed:3", samples=3, max_samples=10, detect=0.01, **settings
    )
    # 3 -> 6 -> 10: a shift of 0.01 is not detectable with 40 tokens, so it grows to the cap
    assert grown.samples == 10 and len(grown.plain_sequences) == len(grown.speculative_sequences) == 10
    assert grown.plain_sequences[:3] == small.plain_sequences
    assert grown.speculative_sequences[:3] == small.speculative_sequences
    assert grown.min_detectable_tvd == pytest.approx(lossless.min_detectable_tvd(40, 40))
    assert len({tuple(s) for s in grown.plain_sequences}) > 3  # new seeds, new samples
    with pytest.raises(ValueError, match="max_samples"):
        lossless.losslessness_check(model, tokenizer, prompt, samples=5, max_samples=4, progress=False)
    with pytest.raises(ValueError, match="detect"):
        lossless.losslessness_check(model, tokenizer, prompt, samples=5, max_samples=8, detect=0, progress=False)


def test_a_report_runs_the_on_request_notebooks_only_when_named(tmp_path):
    from specbench.report.profiles import ON_REQUEST

    assert ON_REQUEST and set(ON_REQUEST) <= set(report.NOTEBOOKS)
    with pytest.raises(FileNotFoundError) as default:
        report.run_report("quick", tmp_path / "out", notebooks=tmp_path, progress=False)
    assert "quickstart" in str(default.value) and not any(f"'{name}'" in str(default.value) for name in ON_REQUEST)
    with pytest.raises(FileNotFoundError, match="notebooks \\['compare'\\] not found"):
        report.run_report("quick", tmp_path / "out", only=["compare"], notebooks=tmp_path, progress=False)
