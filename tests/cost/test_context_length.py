"""The context-length axis: c(w, L) in profiles, their validation, the break-even per length, and Auto
following the length a generation has reached."""

from __future__ import annotations

import json

import pytest

import specbench.cost as cost
from specbench import DraftPolicy, GenerateOptions, speculative_generate
from specbench.cli import main
from specbench.common.identity import device_name, versions
from specbench.core.log import StepLog, StepRecord
from specbench.core.policies import Plain, Speculate
from specbench.cost.breakeven import BreakEven
from specbench.cost.profile import check_profile
from specbench.drafters.lookup import PromptLookup
from specbench.models import synthetic

CHEAP = [1.0, 1.05, 1.1, 1.15, 1.2, 1.25, 1.3, 1.35, 1.4]  # every draft length pays
DEAR = [1.0 * w for w in range(1, 10)]  # no draft length pays: c(k + 1) = k + 1


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBENCH_HOME", str(tmp_path))
    return tmp_path


def flipping_profile(short: int = 64, long: int = 1024) -> cost.Profile:
    """Speculation pays with ``short`` tokens in the cache and never with ``long``."""
    widths = list(range(1, len(CHEAP) + 1))
    return cost.Profile(
        model="m",
        name="m",
        device=device_name(),
        versions=versions(),
        plain_step_s=0.01,
        widths={"fast": widths},
        costs={"fast": CHEAP},
        seconds={"fast": [0.01 * c for c in CHEAP]},
        overhead={"fast": 0.0},
        offset=short,
        lengths={str(long): {"plain_step_s": 0.02, "costs": {"fast": DEAR}, "seconds": {"fast": DEAR}}},
    )


class Drafter:
    preferred_k = 4
    name = "synthetic"


def test_a_profile_at_a_length_holds_the_costs_measured_nearest_it():
    profile = flipping_profile()
    assert profile.context_lengths == [64, 1024]
    assert profile.at_length(10) is profile and profile.at_length(200) is profile
    long = profile.at_length(300)  # nearer 1024 than 64 on a log scale
    assert long.offset == 1024 and long.c(3) == pytest.approx(3.0) and long.plain_step_s == 0.02
    frame = profile.to_polars()
    assert sorted(set(frame["offset"])) == [64, 1024] and len(frame) == 2 * len(CHEAP)


def test_the_break_even_per_length_is_one_object_per_measured_length():
    profile = flipping_profile()
    be = BreakEven(profile, None, "fast")
    assert be.at_length(50) is be and be.at_length(2000) is be.at_length(5000)
    assert be(2) == pytest.approx(CHEAP[2]) and be.at_length(5000)(2) == pytest.approx(3.0)
    assert be.at_length(5000).at_length(10) is be


def prefilled(prompt: int) -> StepLog:
    log = StepLog()
    log.append(StepRecord(step=0, position=0, kind="prefill", emitted=1, verify_width=prompt))
    return log


@pytest.mark.parametrize("measured", [False, True])
def test_auto_drafts_by_the_break_even_at_the_current_length(measured):
    profile = flipping_profile()
    for prompt, drafts in ((40, True), (2000, False)):
        policy = DraftPolicy.auto(measured=measured, probe_tokens=1)
        policy.start(Drafter(), BreakEven(profile, None, "fast"))
        decision = policy.decide(prefilled(prompt), Drafter())
        assert (policy.costs.lengths != []) == drafts
        if not drafts:
            assert isinstance(decision, Plain) and decision.n > 10**6


def test_auto_stops_drafting_when_the_context_grows_past_where_it_pays():
    profile = flipping_profile()
    policy = DraftPolicy.auto(measured=False)
    policy.start(Drafter(), BreakEven(profile, None, "fast"))
    log = prefilled(200)  # nearest 64
    assert policy.decide(log, Drafter()) == Speculate(4)
    log.append(StepRecord(step=1, position=1, kind="verify", k_drafted=4, accepted=4, emitted=5, verify_width=5))
    assert policy.decide(log, Drafter()) == Speculate(4)
    log.append(StepRecord(step=2, position=100, kind="verify", k_drafted=4, accepted=4, emitted=5, verify_width=5))
    assert isinstance(policy.decide(log, Drafter()), Plain)  # 200 + 105 tokens: nearest 1024, where nothing pays
    assert policy.costs.lengths == []


def test_a_generation_follows_the_length_of_its_prompt():
    model = synthetic.build("qwen3-8b-tiny")
    profile = flipping_profile(short=16, long=512)
    options = GenerateOptions(max_tokens=12, ignore_eos=True, verify="fast")
    verifies = {}
    for prompt_len in (24, 600):
        prompt = [(7 * i) % 50 + 3 for i in range(prompt_len)]
        policy = DraftPolicy.auto(measured=False)
        gen = speculative_generate(
            model, prompt, options, drafter=PromptLookup(), policy=policy, profile=profile, progress=None
        )
        list(gen)
        verifies[prompt_len] = sum(r.kind == "verify" for r in gen.log)
    assert verifies[24] > 0 and verifies[600] == 0


def test_stored_profiles_without_lengths_read_as_one_length_and_damaged_lengths_are_refused(home):
    data = flipping_profile().to_dict()
    old = {k: v for k, v in data.items() if k not in ("lengths", "components")}
    assert check_profile(json.loads(json.dumps(old))).context_lengths == [64]
    for damage in (
        {"x": data["lengths"]["1024"]},
        {"1024": data["lengths"]["1024"], "x": data["lengths"]["1024"]},
        {"1024": {**data["lengths"]["1024"], "plain_step_s": 0}},
        {"1024": {**data["lengths"]["1024"], "costs": {"fast": DEAR[:3]}}},
        {"1024": {**data["lengths"]["1024"], "costs": {"exact": DEAR}}},
        {"1024": {**data["lengths"]["1024"], "seconds": [1.0]}},
    ):
        with pytest.raises(ValueError, match="context length"):
            check_profile({**data, "lengths": damage})
    with pytest.raises(ValueError, match="component"):
        check_profile({**data, "components": [{"width": 0, "part": "linear", "seconds": 1.0, "step_s": 1.0}]})


def test_saving_merges_lengths_and_keeps_only_those_that_fit(home):
    profile = flipping_profile()
    cost.save_profile(profile)
    other = flipping_profile(long=4096)
    other.lengths = {"4096": other.lengths["4096"]}
    cost.save_profile(other)
    stored = cost.load_profile("m")
    assert stored.context_lengths == [64, 1024, 4096]


def test_measure_times_every_length_and_the_component_stack():
    model = synthetic.build("qwen3-8b-tiny")
    profile = cost.measure(
        model, widths=3, offset=16, repeats=1, warmup=0, plain_tokens=2, lengths=(48,), components=(2,)
    )
    assert profile.context_lengths == [16, 48]
    assert len(profile.at_length(48).costs["fast"]) == 3 and profile.at_length(48).plain_step_s > 0
    assert {r["part"] for r in profile.components} >= {"linear", "attention", "lm_head", "rollback", "host"}
    assert check_profile(json.loads(json.dumps(profile.to_dict()))).components == profile.components
    with pytest.raises(ValueError, match="context lengths"):
        cost.measure(model, widths=3, offset=16, lengths=(10**7,))
    # a component width past the context: refused before any allocation (it crashed inside the BLAS)
    with pytest.raises(ValueError, match="context lengths"):
        cost.measure(model, widths=3, offset=16, components=(10**7,))
    from specbench.cost.components import measure_components

    with pytest.raises(ValueError, match=r"component widths up to 10000000 with 16 cached tokens exceed the context"):
        measure_components(model, widths=(1, 10**7), offset=16)


def test_cli_profile_prints_the_stack_and_stores_the_lengths(capsys, home):
    args = ["profile", "--model", "synthetic:qwen3-30b-a3b-tiny", "--widths", "3", "--repeats", "2", "--offset", "8"]
    assert main([*args, "--verify", "fast", "--lengths", "32", "--components", "1,3"]) == 0
    out = capsys.readouterr().out
    assert "verify cost by component" in out and "experts" in out and "deciding part:" in out and "off by" in out
    assert "closure" in out and "by phase" not in out  # a CPU's stack: its host does the device's work
    stored = json.loads(next(p for p in (home / "profiles").glob("*.json") if "bandwidth" not in p.name).read_text())
    assert sorted(stored["lengths"]) == ["32"] and {r["width"] for r in stored["components"]} == {1, 3}
    assert main([*args, "--lengths", "32,x"]) == 2
    assert "--lengths takes" in capsys.readouterr().err


def test_a_gpu_stack_is_also_printed_counted_by_phase(capsys):
    from specbench.cli.measure import print_components
    from specbench.cost.components import PARTS

    rows = []
    for w, wait in ((1, 0.004), (3, 0.002)):
        phases = {"forward_s": 0.012, "forward_build_s": 0.003, "forward_dispatch_s": 0.012 - 0.003 - wait}
        # the parts' subtractions count 2 of the build's 3 ms: the one part's host work is 2 ms + the dispatch
        phases |= {"forward_wait_s": wait, "build_closure": -1 / 3, "dispatch_closure": 0.0, "closure": -0.2}
        for part in PARTS:
            seconds = 0.006 if part == "linear" else 0.0
            rows.append(
                {"width": w, "part": part, "device": "gpu:test", "seconds": seconds, "c": seconds / 0.01}
                | {"step_s": 0.012, "c_step": 1.2, "plain_step_s": 0.01, "error": -0.5}
                | {"host_s": 0.002 + phases["forward_dispatch_s"] if part == "linear" else 0.0}
                | phases
            )
    print_components(rows)
    out = capsys.readouterr().out
    wait_line = next(line for line in out.splitlines() if line.strip().startswith("wait"))
    assert wait_line.split()[1:] == ["0.400", "0.200"]  # the wait for the device in plain steps
    by_phase = next(line for line in out.splitlines() if "by phase" in line)
    assert by_phase.split()[2:] == [f"{(0.002 + 0.009) / 0.012 - 1:+.1%}"] * 2  # host work + wait against the step


def test_the_length_figure_names_curves_that_coincide():
    """Two lengths at which every draft length pays even when every draft is rejected draw the same a*(k) = 0
    curve: the figure says so in its legend instead of hiding one (the report's figure checks pass)."""
    from specbench.report.figures import costs_by_length
    from specbench.report.figures.checks import figure_problems

    cheaper = [1.0] + [0.9] * 8  # a verify cheaper than a plain step: a*(k) = 0
    profile = flipping_profile()
    profile.costs = {"fast": cheaper}
    profile.lengths = {"1024": {"plain_step_s": 0.02, "costs": {"fast": [0.95] * 9}, "seconds": {}}}
    fig = costs_by_length([profile])
    labels = [line.get_label() for line in fig.axes[1].lines]
    assert any("same points as" in label for label in labels), labels
    assert figure_problems(fig) == []
