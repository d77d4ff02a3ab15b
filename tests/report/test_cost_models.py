"""The report's cost models: the protocol the break-even page fixes, the models the pages plan with, one measurement
stored for every page and named in the report folder, and the report's time scaled by a model's plain step."""

from __future__ import annotations

import json

import pytest
from conftest import SESSION_HOME

from specbench.cost import Protocol
from specbench.cost.profile import Profile, load_profile
from specbench.inputs.capabilities import has
from specbench.report import cost_models
from specbench.report.profiles import EMBEDDED, EMBEDDED_PLAIN_STEP_S, PROFILES


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBENCH_HOME", str(tmp_path / "home"))


def test_the_break_even_pages_parameters_fix_the_protocol():
    parameters = {"widths": 9, "verify_modes": ["exact", "fast"], "offset": 64, "repeats": 5, "profile_tokens": 8}
    protocol = cost_models.protocol_of({**parameters, "context_lengths": [1024]})
    assert protocol == Protocol(9, ("exact", "fast"), 64, 5, 1, 8, (1024,))
    assert cost_models.protocol_of({}) == Protocol()  # no break-even page: the defaults


def test_the_models_the_pages_plan_with_in_order_and_once():
    resolved = {"quickstart": {"model": "a"}, "sweep": {"model": "a"}, "break_even": {"dense_model": "b"}, "x": {}}
    assert cost_models.models_of(resolved) == ["a", "b"]


def test_one_measurement_stored_for_every_page_and_named_in_the_report(tmp_path):
    protocol = Protocol(widths=3, verify=("fast",), offset=16, repeats=2, plain_tokens=2)
    said = []
    profiles = cost_models.prepare(tmp_path, ["synthetic:qwen3-8b-tiny"], protocol, said.append)
    profile = profiles["synthetic:qwen3-8b-tiny"]
    stored = load_profile(profile.model)
    assert stored is not None and stored.costs == profile.costs  # what profile_for gives every page
    data = cost_models.read(tmp_path)
    assert data["protocol"]["widths"] == 3
    entry = data["models"]["synthetic:qwen3-8b-tiny"]
    assert entry["line"].startswith("cost model: ") and "rounds" in entry["line"]
    assert json.dumps(entry["profile"]["costs"]) == json.dumps(profile.costs)
    assert any("measuring the cost model" in line for line in said)


def test_the_contexts_the_pages_reach_where_their_parameters_bound_them():
    resolved = {
        "sweep": {"max_prompt_tokens": 450, "max_tokens": 32},
        "policies": {"max_prompt_tokens": 160, "max_tokens": 24},
        "unbounded": {"max_prompt_tokens": 0, "max_tokens": 64},
        "no_prompt": {"max_tokens": 16},
    }
    assert cost_models.contexts_of(resolved) == [482, 184]


def test_exact_verification_calibrated_once_for_every_pages_context_before_the_cost_model(tmp_path, fresh_calibrations):
    from specbench.exact.calibration import load_calibration, uncovered
    from specbench.models.load import load

    protocol = Protocol(widths=3, verify=("exact",), offset=16, repeats=2, plain_tokens=2)
    said = []
    cost_models.prepare(tmp_path, ["synthetic:qwen3-8b-tiny"], protocol, said.append, contexts=[300])
    model, _ = load("synthetic:qwen3-8b-tiny")
    lengths = cost_models.calibration_lengths(model, protocol, [300])
    assert lengths == [32, 255, 511]  # the cost model's own context (16 + 3 rows: 255) and the page's (300 tokens)
    stored = load_calibration(model)
    assert sorted(stored.widths) == [2, 3] and all(stored.widths[w].lengths == lengths for w in (2, 3))
    assert uncovered(model, [2, 3], [32, 255, 511]) == []  # a page reaching 300 tokens calibrates nothing more
    assert sum(line.startswith("exact calibration ") for line in said) == 2  # widths 2 and 3, once
    assert not any("calibrating exact verification" in line for line in said)  # the cost model's own: covered


def _profile(plain_step_s: float) -> Profile:
    return Profile("m", "m", "cpu:test", {}, plain_step_s, {"fast": [1]}, {"fast": [1.0]}, {"fast": [plain_step_s]})


def test_a_report_of_another_model_is_expected_to_take_its_plain_step_over_the_embedded_models():
    expected = {"quickstart": 60.0, "explorer": 10.0}
    resolved = {"quickstart": {"model": "big"}, "explorer": {"model": EMBEDDED}}
    said = []
    out = cost_models.scaled(expected, resolved, {"big": _profile(3 * EMBEDDED_PLAIN_STEP_S)}, said.append)
    assert out == {"quickstart": pytest.approx(180.0), "explorer": 10.0}
    assert said and said[0].startswith("about 3 min for the notebooks, from the cost model")


@pytest.mark.skipif(not has("embedded_model"), reason="the miniature uses the embedded model's tokenizer")
def test_each_bundled_prompts_own_context_is_calibrated_before_the_pages(monkeypatch):
    """Each prompt's own context, not only its page's longest: a repeated paragraph of ~400 + 32 tokens calibrates the
    KV step at 511 and an agentic turn of 862 + 32 the one at 1,023, which a page reaching 2,032 tokens (calibrated at
    1,024 and 2,047) does not cover."""
    from specbench.inputs.prompts import prompts_from
    from specbench.models.load import load

    monkeypatch.setenv("SPECBENCH_HOME", str(SESSION_HOME))  # where the embedded model's tokenizer is
    model, tokenizer = load("tiny:smollm2-135m")
    sweep = {**PROFILES["full"]["draft_length_sweep"], "model": "tiny:smollm2-135m"}
    resolved = {"draft_length_sweep": sweep, "other": {"model": "other", "categories": ["rag"], "max_tokens": 8}}
    prompts = prompts_from(
        "bundled", tokenizer, sweep["categories"], sweep["prompts_per_category"], True, sweep["max_prompt_tokens"]
    )
    contexts = cost_models.prompt_contexts(resolved, "tiny:smollm2-135m", tokenizer)
    assert contexts == sorted({len(p.ids) + sweep["max_tokens"] for p in prompts}, reverse=True)
    assert len(prompts) == 9 and len(contexts) > 3  # three kinds of 3 prompts each, lengths differing
    protocol = Protocol(widths=3, verify=("exact",), offset=16, repeats=2, plain_tokens=2)
    longest = cost_models.contexts_of(resolved)
    assert {511, 1023} & set(cost_models.calibration_lengths(model, protocol, longest)) == set()
    assert {511, 1023} <= set(cost_models.calibration_lengths(model, protocol, [*longest, *contexts]))
    # a page without categories, or of another model, adds nothing
    assert cost_models.prompt_contexts({"s": {**sweep, "categories": []}}, "tiny:smollm2-135m", tokenizer) == []
    assert cost_models.prompt_contexts(resolved, "smollm2-135m", tokenizer) == []
