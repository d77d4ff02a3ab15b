"""Cost profiles, break-even math, the controlled-acceptance drafter, MoE expert counting."""

from __future__ import annotations

import json
import time

import mlx.core as mx
import numpy as np
import pytest

import specbench.cost as cost
import specbench.cost.grid as grid_module
from scripts.gpu.cost import expert_counts
from specbench import DraftPolicy, GenerateOptions, StepRecord, generate, speculative_generate
from specbench.cli import main
from specbench.common import identity
from specbench.common.files import DamagedFileWarning
from specbench.common.identity import device_name, kernel_key, model_key, versions
from specbench.core.experts import ExpertCounter
from specbench.core.forward import prefill
from specbench.cost.breakeven import BreakEven
from specbench.cost.profile import check_profile
from specbench.cost.timing import CacheRestore
from specbench.drafters.lookup import PromptLookup
from specbench.drafters.oracle import Oracle
from specbench.models import synthetic

PROMPT = list(range(20, 52))


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBENCH_HOME", str(tmp_path))
    return tmp_path


@pytest.fixture(scope="module")
def dense():
    return synthetic.build("qwen3-8b-tiny")


@pytest.fixture(scope="module")
def moe_model():
    return synthetic.build("qwen3-30b-a3b-tiny")


def make_profile(costs, overhead=0.0, name="m", drafters=None) -> cost.Profile:
    widths = list(range(1, len(costs) + 1))
    return cost.Profile(
        model=name,
        name=name,
        device=device_name(),
        versions=versions(),
        plain_step_s=0.01,
        widths={"fast": widths},
        costs={"fast": list(costs)},
        seconds={"fast": [0.01 * c for c in costs]},
        overhead={"fast": overhead},
        drafters=drafters or {},
    )


# -- break-even math ----------------------------------------------------------------------------


def test_expected_tokens():
    assert cost.expected_tokens(1.0, 4) == 5.0
    assert cost.expected_tokens(0.0, 4) == 1.0
    assert cost.expected_tokens(0.5, 2) == pytest.approx(1.75)
    assert cost.expected_tokens([0.9, 0.5, 0.1], 3) == pytest.approx(1 + 0.9 + 0.45 + 0.045)
    with pytest.raises(ValueError, match="fewer than k"):
        cost.expected_tokens([0.9], 2)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        cost.expected_tokens(1.2, 2)


def test_speedup_and_break_even():
    c = [1.05, 1.4, 1.8, 2.2, 2.3, 2.4, 2.5, 2.6, 2.7]
    d = 0.02
    assert cost.speedup(0.8, 3, c, d) == pytest.approx(cost.expected_tokens(0.8, 3) / (2.2 + 3 * d))
    a_star = cost.break_even_acceptance(c, d, max_k=8)
    assert a_star[0] == pytest.approx(1.4 + d - 1.0)  # k = 1: 1 + a = c(2) + d
    for k, a in enumerate(a_star, 1):
        assert cost.speedup(a, k, c, d) == pytest.approx(1.0, abs=1e-9)
        assert cost.speedup(min(1.0, a + 0.01), k, c, d) > 1.0
    assert np.isnan(cost.break_even_acceptance([1.0, 3.5], 0.0)[0])  # c(2) > 2: never pays
    assert cost.break_even_acceptance([1.0, 0.9], 0.0)[0] == 0.0  # pays even when all rejected


def test_best_k_is_the_argmax():
    c = [1.0, 1.3, 1.6, 1.9, 2.0, 2.1, 2.2, 2.3, 3.5]
    for a in (0.3, 0.6, 0.8, 0.95):
        k, s = cost.best_k(a, c, 0.01)
        brute = max(range(9), key=lambda j: cost.speedup(a, j, c, 0.01))
        assert k == brute and s == pytest.approx(cost.speedup(a, k, c, 0.01))
    assert cost.best_k(0.1, [1.0, 3.0, 4.0])[0] == 0  # nothing beats plain decoding


def test_cost_at():
    c = [1.0, 1.5, 2.5]
    assert cost.cost_at(c, 2) == 1.5 and cost.cost_at(c, 2.5) == 2.0
    assert cost.cost_at(c, 5) == pytest.approx(2.5 + 0.75 * 2)  # mean slope past the last width
    with pytest.raises(ValueError):
        cost.cost_at(c, 0)


def test_a_noisy_falling_curve_is_extended_flat_and_auto_starts_on_it():
    """A quick profile timed under load can fall from c(1) to c(W); extended at that negative slope it went below
    zero past W, and Auto refused its negative break-even ("the break-even of k = 8 must be ... >= 0")."""
    falling = [1.6, 1.2, 0.9]
    assert [cost.cost_at(falling, w) for w in (4, 9)] == [0.9, 0.9]
    from specbench.core.auto import CostEnvelope

    envelope = CostEnvelope(lambda k: cost.break_even_tokens(falling, k), longest=8)
    assert [envelope.break_even(k) for k in (1, 2, 8)] == [1.2, 0.9, 0.9]
    assert envelope.lengths == list(range(2, 9))  # k = 1 costs more than every wider length


# -- profiles -----------------------------------------------------------------------------------


def test_measure_save_load(dense, home):
    profile = cost.measure(dense, widths=4, verify=("fast", "exact"), offset=16, repeats=2, warmup=1, plain_tokens=4)
    assert profile.widths == {"fast": [1, 2, 3, 4], "exact": [1, 2, 3, 4]}
    for mode in ("fast", "exact"):
        assert all(c > 0 for c in profile.costs[mode])
        # c(w): the median over the rounds of each round's width seconds over its own plain step
        paired = [s / p for s, p in zip(profile.rounds[mode][2], profile.rounds["plain"])]
        assert profile.costs[mode][2] == pytest.approx(float(np.median(paired)))
        assert mode in profile.overhead
    assert profile.name == "synthetic:qwen3-8b-tiny-fp32" and profile.offset == 16 and profile.repeats == 2
    path = cost.save_profile(profile)
    assert path.parent == home / "profiles" and json.loads(path.read_text())["model"] == model_key(dense)
    loaded = cost.load_profile(dense)
    assert loaded.costs == profile.costs and loaded.overhead == profile.overhead
    # A later profile of one mode keeps the other mode already stored.
    cost.save_profile(cost.measure(dense, widths=3, offset=16, repeats=1, warmup=0, plain_tokens=2))
    merged = cost.load_profile(dense)
    assert merged.widths == {"fast": [1, 2, 3], "exact": [1, 2, 3, 4]}


def test_damaged_profile_file(home):
    profile = make_profile([1.0, 1.5, 2.0], name="damaged")
    good = make_profile([1.0, 1.2], name="good")
    cost.save_profile(good)
    path = profile.path()
    for text in (
        "{not json",
        json.dumps({"model": "damaged"}),
        "[1, 2]",
        json.dumps({**profile.to_dict(), "costs": 3}),
        json.dumps({**profile.to_dict(), "costs": {"fast": [1.0, "x", 2.0]}}),
        json.dumps({**profile.to_dict(), "costs": {"fast": [1.0, float("nan"), 2.0]}}),
        json.dumps({**profile.to_dict(), "widths": {"fast": None}}),
        json.dumps({**profile.to_dict(), "plain_step_s": "fast"}),
    ):
        path.write_text(text)
        # Loading it moves it aside with a warning naming it: it is measured anew.
        with pytest.warns(DamagedFileWarning, match=f"cost profile {path} is damaged .*moved aside"):
            assert cost.load_profile("damaged") is None
        assert not path.exists()
    assert len(list(path.parent.glob(f"{path.name}.damaged-*"))) == 8
    # Saving over a damaged file moves it aside and writes the new one.
    path.write_text("{not json")
    with pytest.warns(DamagedFileWarning, match=str(path)):
        assert cost.save_profile(profile) == path
    assert cost.load_profile("damaged").costs == profile.costs
    assert len(list(path.parent.glob(f"{path.name}.damaged-*"))) == 9


def test_profile_for_measures_anew_over_a_damaged_profile(home):
    model = synthetic.build("qwen3-8b-tiny", seed=5)  # a fresh object: nothing in memory for it
    path = cost.profile_path(model_key(model), device_name(), versions())
    path.parent.mkdir(parents=True)
    path.write_text('{"model": "x", ')
    said = []
    with pytest.warns(DamagedFileWarning, match=str(path)):
        profile = cost.profile_for(model, progress=said.append)
    assert profile.quick and len(said) == 1 and not path.exists()
    assert cost.save_profile(profile) == path and cost.load_profile(model).costs == profile.costs


def test_profiles_are_keyed_by_the_blas_library(dense, monkeypatch):
    profile = make_profile([1.0, 1.5], name=model_key(dense))
    assert profile.kernels == kernel_key()
    path = cost.save_profile(profile)
    assert cost.load_profile(dense).kernels == kernel_key()
    monkeypatch.setattr(identity, "blas_in_use", lambda: "OtherBLAS 9.9, 3 threads")
    monkeypatch.setattr(identity.mx, "default_device", lambda: mx.Device(mx.cpu))
    assert cost.load_profile(dense) is None  # taken under another BLAS: not reused
    other = make_profile([1.0, 1.9], name=model_key(dense))
    assert "OtherBLAS 9.9" in other.kernels and cost.save_profile(other) != path
    assert cost.load_profile(dense).costs == other.costs
    # A profile stored before the kernels were kept is not taken for this BLAS's.
    old = {k: v for k, v in profile.to_dict().items() if k != "kernels"}
    assert cost.Profile.from_dict(old).kernels == ""


def test_measure_hybrid_restores_recurrent_cache():
    model = synthetic.build("qwen3.5-9b-tiny")
    cache = prefill(model, PROMPT)
    restore = CacheRestore(cache)
    probe = mx.array([[7, 8, 9]])
    first = np.array(model(probe, cache=cache))
    restore()
    model(mx.array([[1, 2, 3, 4, 5]]), cache=cache)
    restore()
    assert np.array_equal(np.array(model(probe, cache=cache)), first)
    profile = cost.measure(model, widths=3, offset=16, repeats=1, warmup=0, plain_tokens=2)
    assert profile.widths["fast"] == [1, 2, 3]


def test_model_key_follows_shapes_not_values():
    a, b = synthetic.build("qwen3-8b-tiny", seed=0), synthetic.build("qwen3-8b-tiny", seed=1)
    assert model_key(a) == model_key(b)
    assert model_key(a) != model_key(synthetic.build("qwen3-8b-tiny", bits=4, dtype="float32"))


def _store_profile(dense):
    """A stored profile of ``dense`` (c(1..6), overhead 0.1, a measured lookup drafter)."""
    stored = make_profile(
        [1.0, 1.2, 1.5, 1.7, 1.9, 2.0],
        overhead=0.1,
        name=model_key(dense),
        drafters={"lookup": {"k": 4, "d": 0.05, "draft_s": 0.0005}},
    )
    cost.save_profile(stored)
    return stored


def test_profile_for_uses_stored_profile_then_memory(dense):
    stored = _store_profile(dense)
    profile = cost.profile_for(dense)
    assert profile.costs == stored.costs and not profile.quick
    assert cost.profile_for(dense) is profile
    from specbench.cost.measure import forget, lockstep_profile

    assert lockstep_profile(dense) is profile  # one memory per model object, whichever reader filled it
    forget(dense)
    lockstep = lockstep_profile(dense)  # a world of one: rank 0's stored profile
    assert lockstep is not profile and lockstep.costs == stored.costs and cost.profile_for(dense) is lockstep

    class Lookup:
        name, cost_per_token = "lookup", 0.5

    # c(k+1) + overhead + k d, with d from the profile's measurement of the drafter.
    assert cost.break_even_tokens(profile, 3, Lookup()) == pytest.approx(1.7 + 0.1 + 3 * 0.05)
    assert cost.break_even_tokens(profile, 3, None) == pytest.approx(1.8)
    assert cost.break_even_tokens(profile, 3, Lookup(), d=0.2) == pytest.approx(1.8 + 3 * 0.2)
    assert cost.preferred_k(profile, 1.0, max_k=5) == 5
    # A bare cost curve: the drafter's own cost per token.
    assert cost.break_even_tokens([1.0, 1.2, 1.5], 1, Lookup()) == pytest.approx(1.2 + 0.5)
    assert cost.preferred_k([1.0, 1.2, 1.5], 1.0, max_k=2) == 2
    assert cost.preferred_k([1.0, 1.2, 1.5], 0.5, Lookup(), max_k=2) == 0  # d = 0.5: drafting never pays
    with pytest.raises(TypeError, match="profile_for"):
        cost.break_even_tokens(dense, 3)


def test_auto_plans_with_the_stored_profile(dense):
    _store_profile(dense)
    drafter, policy = PromptLookup(), DraftPolicy.auto()
    said = []
    gen = speculative_generate(
        dense,
        PROMPT * 2,
        GenerateOptions(max_tokens=8, verify="fast"),
        drafter=drafter,
        policy=policy,
        progress=said.append,
    )
    list(gen)
    assert not said  # nothing was measured
    profile = cost.profile_for(dense)
    # Auto's break-even for the length it chose is the stored profile's (no drafter-preferred length any more).
    assert policy.k >= 1 and policy.break_even == pytest.approx(cost.break_even_tokens(profile, policy.k, drafter))


def test_profile_for_measures_quickly_when_nothing_is_stored(moe_model):
    said = []
    profile = cost.profile_for(moe_model, progress=said.append)
    assert len(said) == 1 and "measuring" in said[0]  # announced once, before measuring
    assert profile.quick and {1, 2, 5} <= set(profile.widths["fast"]) <= set(cost.QUICK_WIDTHS)
    assert profile.costs["fast"][0] == 1.0  # the plain step is a serial width-1 step here
    assert cost.profile_for(moe_model, progress=said.append) is profile and len(said) == 1
    assert cost.break_even_tokens(profile, 4) == pytest.approx(profile.c(5))
    with pytest.raises(ValueError, match="no 'exact' verify costs"):
        profile.c(2, "exact")


def test_measure_rejects_bad_input(dense):
    with pytest.raises(ValueError, match="verify mode"):
        cost.measure(dense, widths=2, verify=("slow",))
    with pytest.raises(ValueError, match="widths"):
        cost.measure(dense, widths=0)


# -- the controlled-acceptance drafter and the measured grid ------------------------------------


@pytest.mark.parametrize("a", [0.0, 0.6, 1.0])
def test_oracle_greedy_output_and_acceptance(dense, a):
    n = 60
    drafter = Oracle.from_model(dense, PROMPT, n, a, seed=3)
    plain = list(generate(dense, PROMPT, GenerateOptions(max_tokens=n, ignore_eos=True)))
    assert drafter.continuation == plain
    gen = speculative_generate(
        dense,
        PROMPT,
        GenerateOptions(max_tokens=n, ignore_eos=True, verify="fast"),
        drafter=drafter,
        policy=DraftPolicy.fixed(3),
    )
    assert list(gen) == plain and drafter.diverged_at is None
    verifies = [r for r in gen.log if r.kind == "verify"]
    accepted = sum(r.accepted for r in verifies)
    rejected = sum(r.accepted < r.k_drafted for r in verifies)
    if a == 1.0:
        assert rejected == 0
    elif a == 0.0:
        assert accepted == 0
    else:
        assert 0.4 < accepted / (accepted + rejected) < 0.8  # per-position acceptance near a
    # Seeded: the same drafts again.
    again = speculative_generate(
        dense,
        PROMPT,
        GenerateOptions(max_tokens=n, ignore_eos=True, verify="fast"),
        drafter=drafter,
        policy=DraftPolicy.fixed(3),
    )
    list(again)
    assert [r.draft_tokens for r in again.log] == [r.draft_tokens for r in gen.log]


def test_oracle_follows_a_diverged_output(dense):
    drafter = Oracle.from_model(dense, PROMPT, 40, 1.0, follow=True)
    truth = list(drafter.continuation)
    drafter.recorded = truth[:10] + [(t + 1) % 512 for t in truth[10:]]  # a wrong record from position 10
    gen = speculative_generate(
        dense,
        PROMPT,
        GenerateOptions(max_tokens=40, ignore_eos=True, verify="fast"),
        drafter=drafter,
        policy=DraftPolicy.fixed(4),
    )
    assert list(gen) == truth
    assert drafter.diverged_at == 10 and drafter.follows >= 1 and drafter.follow_s > 0
    assert gen.stats()["acceptance_rate"] > 0.9
    still = Oracle(PROMPT, drafter.recorded, 1.0, 512)  # without a model it stops drafting
    list(
        speculative_generate(
            dense,
            PROMPT,
            GenerateOptions(max_tokens=40, ignore_eos=True, verify="fast"),
            drafter=still,
            policy=DraftPolicy.fixed(4),
        )
    )
    assert still.diverged_at == 10 and still.follows == 0


def test_oracle_rejects_bad_input():
    with pytest.raises(ValueError, match="acceptance"):
        Oracle([1], [2], 1.5, 10)
    with pytest.raises(ValueError, match="empty"):
        Oracle([1], [], 0.5, 10)
    drafter = Oracle([1, 2], [3], 0.5, 10)
    with pytest.raises(ValueError, match="another prompt"):
        drafter.begin([9])


def test_speedup_grid_rows(dense):
    profile = make_profile([1.0, 1.1, 1.2, 1.3, 1.4], name=model_key(dense))
    rows = cost.speedup_grid(dense, profile, acceptances=(0.0, 1.0), ks=(1, 3), prompt_len=16, max_tokens=20)
    assert [(r["a"], r["k"]) for r in rows] == [(0.0, 1), (1.0, 1), (0.0, 3), (1.0, 3)]
    for r in rows:
        assert r["speedup"] == pytest.approx(r["plain_s_per_token"] / r["spec_s_per_token"])
        assert r["predicted_nominal"] == pytest.approx(cost.speedup(r["a"], r["k"], profile, r["d"]))
        assert r["error_nominal"] == pytest.approx(r["speedup"] / r["predicted_nominal"] - 1)
        # The time error compares speculative seconds per token with the profile's prediction.
        assert r["error_time"] == pytest.approx(r["spec_s_per_token"] / r["predicted_spec_s_per_token"] - 1)
        assert r["plain_over_profile"] == pytest.approx(r["plain_s_per_token"] / profile.plain_step_s)
        assert r["tokens"] == 20 and r["diverged_at"] is None
        assert r["acceptance_measured"] == r["a"]
    full = rows[3]
    assert full["tokens_per_verify"] > 3.5  # k + 1 = 4 per verification, bar the last
    with pytest.raises(ValueError, match="no 'exact' verify costs"):
        cost.speedup_grid(dense, profile, verify="exact")


@pytest.mark.parametrize(
    "acceptances, ks, message",
    [
        ((0.5, float("nan")), (2,), r"a grid acceptance must be a finite number in \[0.0, 1.0\], got nan"),
        ((float("inf"),), (2,), "a grid acceptance"),
        ((1.5,), (2,), r"a grid acceptance .* got 1.5"),
        ((-0.1,), (2,), "a grid acceptance"),
        ((0.5,), (0,), "a grid draft length"),
        ((0.5,), (1000,), "a grid draft length 1000 is over the longest draft"),
    ],
    ids=["nan", "inf", "above 1", "below 0", "k zero", "k past the bound"],
)
def test_speedup_grid_refuses_a_bad_cell_before_any_model_work(dense, acceptances, ks, message, monkeypatch):
    def fail(*args, **kwargs):
        pytest.fail("the grid began model work before checking its cells")

    monkeypatch.setattr(grid_module, "verifier_for", fail)
    profile = make_profile([1.0, 1.1, 1.2], name=model_key(dense))
    with pytest.raises(ValueError, match=message):
        cost.speedup_grid(dense, profile, acceptances=acceptances, ks=ks, prompt_len=8, max_tokens=8)


def test_an_oracles_acceptance_set_again_is_checked():
    oracle = Oracle([1], [2, 3], 0.5, 97)
    oracle.acceptance = 1
    assert oracle.acceptance == 1.0
    for bad in (float("nan"), 1.5, -0.5):
        with pytest.raises(ValueError, match="acceptance must be a finite number in"):
            oracle.acceptance = bad
    assert oracle.acceptance == 1.0


def test_predicted_speedup_for_the_steps_a_run_took():
    records = [
        StepRecord(0, 0, "prefill", emitted=1, verify_width=10, k_drafted=0),
        StepRecord(1, 1, "verify", emitted=3, accepted=2, verify_width=3, k_drafted=2),
        StepRecord(2, 4, "verify", emitted=1, accepted=0, verify_width=3, k_drafted=2),
        StepRecord(3, 5, "plain", emitted=1, verify_width=1, k_drafted=0),
    ]
    # a_1 = 1/2, a_2 = 1: E(2) = 2 per verification, as emitted on average
    profile = make_profile([1.0, 1.2, 1.5])
    assert cost.predicted_speedup(records, profile, d=0.1) == pytest.approx(5 / (1.5 + 0.2 + 1.5 + 0.2 + 1.0))


def test_planning_on_a_stored_profile_names_its_file(dense):
    """A profile that passes the checks but lacks a verify mode: the planning error names the stored file."""
    path = cost.save_profile(make_profile([1.0, 1.2, 1.5], name=model_key(dense)))
    profile = cost.load_profile(dense)
    assert profile.source == str(path) and "source" not in profile.to_dict()
    with pytest.raises(ValueError, match=f"stored in {path} has no 'exact' verify costs"):
        cost.break_even_tokens(profile, 2, verify="exact")
    with pytest.raises(ValueError, match=f"stored in {path} has no 'exact' verify costs"):
        BreakEven(profile, None, "exact")(2)


def test_a_length_measured_in_another_mode_only_is_priced_at_the_profiles_own_length():
    profile = make_profile([1.0, 1.2, 1.5])
    profile.offset = 64
    for part in ("widths", "costs", "seconds"):
        getattr(profile, part)["exact"] = list(getattr(profile, part)["fast"])
    profile.lengths = {"1024": {"plain_step_s": 0.02, "costs": {"fast": [2.0] * 3}, "seconds": {"fast": [0.04] * 3}}}
    check_profile(json.loads(json.dumps(profile.to_dict())))
    records = [StepRecord(1, 1000, "verify", emitted=2, accepted=1, verify_width=3, k_drafted=2)]
    exact = cost.predicted_speedup(records, profile, mode="exact", tokens="emitted")
    assert exact == pytest.approx(2 / 1.5)  # c(3) at the offset: no exact costs at length 1024
    assert cost.predicted_speedup(records, profile, mode="fast", tokens="emitted") == pytest.approx(2 / 2.0)


def test_an_overhead_that_makes_a_verification_free_is_refused():
    data = make_profile([1.0, 1.2, 1.5], overhead=-1.0).to_dict()
    with pytest.raises(ValueError, match="'fast' overhead -1.0 makes a verification cost nothing or less"):
        check_profile(data)
    data["overhead"] = {"fast": -0.5}
    assert check_profile(data).c(1, "fast") == pytest.approx(0.5)


# -- MoE instrumentation ------------------------------------------------------------------------


def test_expected_distinct_experts():
    assert cost.expected_distinct_experts(128, 8, 1) == pytest.approx(8)
    assert cost.expected_distinct_experts(128, 8, 2) == pytest.approx(128 * (1 - (120 / 128) ** 2))
    assert cost.expected_distinct_experts(128, 8, 1000) == pytest.approx(128)
    with pytest.raises(ValueError):
        cost.expected_distinct_experts(8, 9, 1)


def test_expert_counter(moe_model):
    x = mx.array([[3, 14, 15, 92, 65, 35, 89, 79]])
    before = type(moe_model.model.layers[0].mlp.switch_mlp)
    reference = np.array(moe_model(x))
    with ExpertCounter(moe_model) as counter:
        out = np.array(moe_model(x))
        counts = counter.take()
        assert counter.take() == [0, 0]  # a new window
        moe_model(x[:, :1])
        single = counter.take()
    assert np.array_equal(out, reference)  # counting changes nothing
    assert type(moe_model.model.layers[0].mlp.switch_mlp) is before
    assert single == [2, 2]  # one token touches its top-2 experts in every layer
    assert all(2 <= c <= 8 for c in counts)
    # Routing recomputed by hand agrees with the counter for the first layer.
    layer = moe_model.model.layers[0]
    e = moe_model.model.embed_tokens(x)
    h = layer.post_attention_layernorm(e + layer.self_attn(layer.input_layernorm(e), mask="causal"))
    inds = np.array(mx.argpartition(layer.mlp.gate(h), kth=-2, axis=-1)[..., -2:])
    assert counts[0] == len(np.unique(inds))


def test_expert_counter_inside_exact_mode(moe_model):
    from specbench.exact import exact_mode

    x = mx.array([[3, 14, 15, 92, 65, 35]])
    with ExpertCounter(moe_model) as counter:
        moe_model(x)
        batched = counter.take()
        with exact_mode(moe_model, "all"):
            mx.eval(moe_model(x))
        assert counter.take() == batched  # row-by-row expert calls are counted together per layer


def test_expert_counts_and_errors(moe_model, dense):
    rows = expert_counts(moe_model, [1, 4], offset=8, trials=2)
    assert rows[0]["distinct_experts"] == 2.0 and rows[0]["expected_uniform"] == 2.0
    assert 2.0 <= rows[1]["distinct_experts"] <= 8.0
    assert cost.routing(moe_model) == (8, 2)
    with pytest.raises(ValueError, match="no MoE expert layers"):
        ExpertCounter(dense)


# -- command line -------------------------------------------------------------------------------


def test_cli_profile(capsys, home):
    args = [
        "profile",
        "--model",
        "synthetic:qwen3-30b-a3b-tiny",
        "--widths",
        "3",
        "--repeats",
        "1",
        "--offset",
        "8",
        "--verify",
        "fast",
        "--plot",
        str(home / "fig"),
    ]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "a*(k) fast" in out and "profile:" in out
    assert (home / "fig" / "costs.png").stat().st_size > 0 and (home / "fig" / "break_even.png").exists()
    profiles = [p for p in (home / "profiles").glob("*.json") if not p.name.startswith("bandwidth--")]
    assert len(profiles) == 1  # one cost profile (beside the device's measured bandwidth)
    assert main(["profile", "--model", "synthetic:qwen3-8b-tiny", "--verify", "slow"]) == 2
    assert "--verify takes" in capsys.readouterr().err


def test_measure_drafter_steady_state():
    pytest.importorskip("specbench.models.mtp")
    from specbench.drafters import make_drafter

    model = synthetic.build("qwen3.5-9b-tiny", mtp=True)
    context = list(range(30, 60)) * 2  # repeats itself: lookup finds matches
    for name in ("lookup", "mtp"):
        entry = cost.measure_drafter(model, make_drafter(name, model=model), context, 3, plain_step_s=0.01, repeats=3)
        assert entry["drafted"] == 3 and entry["draft_s"] > 0
        assert entry["d"] == pytest.approx(entry["draft_s"] / 3 / 0.01)


# -- figures --------------------------------------------------------------------------------------


def test_figures(tmp_path):
    from specbench.report import figures

    dense_p = make_profile([1.0, 1.4, 1.8, 2.2, 2.6, 2.9, 1.9, 1.9], overhead=0.05, name="synthetic:qwen3-8b-4bit")
    moe_p = make_profile([1.0, 1.7, 1.8, 1.9, 2.0, 2.0, 2.0, 2.1], name="synthetic:qwen3-30b-a3b-4bit")
    fig = figures.verify_costs([dense_p, moe_p])
    ax = fig.axes[0]
    assert "dense vs MoE" in ax.get_title() and "w" in ax.get_xlabel() and "c(w)" in ax.get_ylabel()
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert any("qwen3-8b-4bit" in t for t in labels) and any("qwen3-30b-a3b-4bit" in t for t in labels)
    colours = {line.get_label().split(" ")[0]: line.get_color() for line in ax.get_lines()}
    assert colours["qwen3-8b-4bit"] == "tab:blue" and colours["qwen3-30b-a3b-4bit"] == "tab:orange"
    assert figures.save_figure(fig, tmp_path / "c.png").stat().st_size > 10_000
    fig = figures.break_even([dense_p, moe_p], max_k=7)
    line = fig.axes[0].get_lines()[0]
    assert np.allclose(line.get_ydata(), cost.break_even_acceptance(dense_p, 0.0, 7), equal_nan=True)
    figures.save_figure(fig, tmp_path / "a.png")
    rows = [
        {
            "name": dense_p.name,
            "mode": "fast",
            "a": a,
            "k": k,
            "d": 0.0,
            "speedup": cost.speedup(a, k, dense_p) * 0.95,
            "error_nominal": -0.05,
        }
        for a in (0.5, 1.0)
        for k in (1, 4)
    ]
    fig = figures.measured_vs_predicted(rows, {dense_p.name: dense_p})
    assert "error" in fig.axes[0].get_title() and len(fig.axes[0].collections) == 4  # per k: realized, nominal
    figures.save_figure(fig, tmp_path / "m.png")
    for r in rows:
        r["spec_s_per_token"], r["predicted_spec_s_per_token"] = 0.011, 0.010
    fig = figures.measured_vs_predicted(rows, {dense_p.name: dense_p})
    assert len(fig.axes) == 2 and "mean 10.0%" in fig.axes[1].get_title()  # the seconds-per-token panel
    figures.save_figure(fig, tmp_path / "t.png")
    with pytest.raises(ValueError, match="no grid rows"):
        figures.measured_vs_predicted(rows, {dense_p.name: dense_p}, modes=["exact"])


def test_the_fastest_pass_leaves_its_warm_up_out():
    from specbench.cost.bandwidth import _fastest

    calls = []

    def run():  # the warm-up returns at once, every timed call takes 20 ms
        if calls:
            time.sleep(0.02)
        calls.append(1)

    assert _fastest(run, repeats=2) >= 0.02 and len(calls) == 3
