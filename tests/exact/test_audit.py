"""Exactness that fails closed: calibration at the cache lengths a generation reaches, serial steps past them,
and the audit that compares verifications with serial steps and names the first diverging operation.

The emulated device (``conftest.emulate_gpu(beyond_keys=N)``) computes multi-row attention row by row, as one-query
calls do, up to N keys and differs past them: calibration at short caches alone would pick batched attention.
"""

from __future__ import annotations

import json
import warnings

import mlx.core as mx
import numpy as np
import polars as pl
import pytest
from conftest import BUMP, ScriptedDrafter, build_tiny, emulate_gpu, plain_greedy

from specbench.common import identity
from specbench.common.files import DamagedFileWarning
from specbench.core.engine import Generation
from specbench.core.options import GenerateOptions
from specbench.core.policies import DraftPolicy
from specbench.decoding import speculative_generate
from specbench.exact import ExactVerifier, calibrate, calibration_key, exact_mode, load_calibration
from specbench.exact import calibration as exact_calibration
from specbench.exact.audit import Divergence
from specbench.exact.calibration import lengths_for
from specbench.exact.verifier import ExactAuditWarning

PROMPT = 300  # tokens: the verifications attend more keys than the emulated device's threshold
BEYOND = 270  # past the 255-token probe's keys
TOKENS = 16
K = 3


@pytest.fixture(scope="module")
def model():
    return build_tiny("qwen3")


@pytest.fixture(scope="module")
def prompt():
    return np.random.default_rng(7).integers(0, 97, PROMPT).tolist()


@pytest.fixture(autouse=True)
def _fresh_calibrations():
    exact_calibration._calibrations.clear()
    yield
    exact_calibration._calibrations.clear()


def _forget_stored(model) -> None:
    exact_calibration._calibration_path(calibration_key(model)).unlink(missing_ok=True)


def _generate(model, prompt, truth, audit: float = 0.0, **kwargs):
    drafter = ScriptedDrafter(truth, len(prompt), 97)
    options = GenerateOptions(max_tokens=TOKENS, audit=audit)
    gen = speculative_generate(model, prompt, options, drafter=drafter, policy=DraftPolicy.fixed(K), **kwargs)
    return list(gen), gen


def _split_logits(model, prompt, tokens: list[int], level) -> tuple[np.ndarray, np.ndarray]:
    """One verification of ``tokens`` at ``level`` after ``prompt``, and serial steps of them."""
    from mlx_lm.models.cache import make_prompt_cache

    out = []
    for serial in (False, True):
        cache = make_prompt_cache(model)
        model(mx.array([prompt]), cache=cache)
        if serial:
            rows = [model(mx.array([[t]]), cache=cache)[0] for t in tokens]
            out.append(np.array(mx.concatenate(rows, axis=0)))
        else:
            with exact_mode(model, level):
                out.append(np.array(model(mx.array([tokens]), cache=cache)[0]))
    return out[0], out[1]


def test_lengths_cover_the_context_up_to_32k():
    assert lengths_for(100) == [32, 255]
    assert lengths_for(820) == [32, 255, 1023]
    assert lengths_for(40_000) == [32, 255, 1024, 4096, 8192, 16384, 32768, 40191]
    assert lengths_for(40_000, limit=32768) == [32, 255, 1024, 4096, 8192, 16384]
    with pytest.raises(ValueError, match="integer >= 1"):
        lengths_for(0)


@pytest.mark.reference_blas  # must hold on either BLAS
def test_calibration_at_short_caches_misses_a_switch_that_the_generation_context_finds(monkeypatch, model, prompt):
    _forget_stored(model)
    emulate_gpu(monkeypatch, attention=True, linear_rows=None, beyond_keys=BEYOND)
    # At 32 cached tokens batched attention is exact: the cheapest pick batches it ...
    short = calibrate(model, [K + 1], lengths=[32], measure=False, save=False)
    assert "attention" not in short.level_for(K + 1)
    got, want = _split_logits(model, prompt, [5, 6, 7, 8], short.level_for(K + 1))
    assert not np.array_equal(got, want)  # ... and past 270 keys it is not bit-identical to serial steps
    exact_calibration._calibrations.clear()
    truth = plain_greedy(model, prompt, TOKENS)
    out, gen = _generate(model, prompt, truth)
    assert out == truth
    stored = load_calibration(model)
    for w in range(2, K + 2):
        assert stored.widths[w].reach >= PROMPT + TOKENS  # calibrated as far as this generation reaches
        assert "attention" in stored.widths[w].level or stored.widths[w].level == "serial"
    assert "exact_audit" not in gen.stats()  # nothing audited, nothing past the calibration


def test_a_verification_past_the_calibrated_lengths_calibrates_them_first(monkeypatch, model, prompt):
    _forget_stored(model)
    emulate_gpu(monkeypatch, attention=True, linear_rows=None, beyond_keys=BEYOND)
    calibrate(model, range(2, K + 2), lengths=[32], measure=False)
    truth = plain_greedy(model, prompt, TOKENS)
    drafter = ScriptedDrafter(truth, len(prompt), 97)
    verifier = ExactVerifier(model)  # not prepared for this context (speculative_generate would calibrate it)
    options = GenerateOptions(max_tokens=TOKENS)
    gen = Generation(model, prompt, options, drafter=drafter, policy=DraftPolicy.fixed(K), verifier=verifier)
    assert list(gen) == truth
    audit = gen.stats()["exact_audit"]
    assert audit.calibrated >= 1 and audit.beyond_reach == 0 and audit.audited == 0
    assert verifier.audit_result() is audit and "calibrated further during generation" in audit.summary()
    assert load_calibration(model).widths[K + 1].reach >= PROMPT  # stored: the next run starts calibrated


def test_where_the_context_leaves_no_room_to_calibrate_verifications_run_serially(monkeypatch, prompt):
    short = build_tiny("qwen3", max_position_embeddings=PROMPT + TOKENS + 8)  # no room for a probe at 511
    _forget_stored(short)  # (its key is the other tiny qwen3's: the same shapes run the same kernels)
    emulate_gpu(monkeypatch, attention=True, linear_rows=None, beyond_keys=BEYOND)
    truth = plain_greedy(short, prompt, TOKENS)
    out, gen = _generate(short, prompt, truth, progress=None)
    assert out == truth
    assert load_calibration(short).widths[K + 1].reach == 255  # the longest probe that fits
    audit = gen.stats()["exact_audit"]
    assert audit.beyond_reach == audit.verifications > 0 and audit.audited == 0


@pytest.mark.reference_blas  # must hold on either BLAS
def test_audit_falls_back_to_serial_steps_and_names_the_diverging_operation(monkeypatch, model, prompt):
    """A calibration that covers the context, made before the device changed (a driver update, say): the audit's
    first verification differs; the generation goes on serially, exact, warns once and names the operation."""
    _forget_stored(model)
    emulate_gpu(monkeypatch, attention=True, linear_rows=None, beyond_keys=4 * PROMPT)
    calibrate(model, range(2, K + 2), lengths=lengths_for(PROMPT + TOKENS), measure=False)
    monkeypatch.setitem(BUMP, "beyond_keys", BEYOND)  # the device now switches kernels past 270 keys
    truth = plain_greedy(model, prompt, TOKENS)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out, gen = _generate(model, prompt, truth, audit=1.0, progress=None)
    assert out == truth
    assert [w.category for w in caught] == [ExactAuditWarning]
    audit = gen.stats()["exact_audit"]
    assert audit.mismatches == audit.audited == 1 and audit.fell_back_at == 1 and audit.verifications > 1
    found = audit.divergence
    assert isinstance(found, Divergence)
    assert (found.layer, found.op, found.width, found.cache_length) == (
        0,
        "self_attn.scaled_dot_product_attention",
        K + 1,
        PROMPT,
    )
    assert found.max_abs_diff == pytest.approx(BUMP["size"], rel=1e-3)
    assert f"layer 0 self_attn.scaled_dot_product_attention at width {K + 1}, cache length {PROMPT}" in audit.summary()
    assert "layer 0 self_attn.scaled_dot_product_attention" in str(caught[0].message)


def test_audit_of_an_exact_device_finds_nothing(monkeypatch, model, prompt):
    _forget_stored(model)
    emulate_gpu(monkeypatch, attention=True, linear_rows=None, beyond_keys=BEYOND)
    truth = plain_greedy(model, prompt, TOKENS)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ExactAuditWarning)
        out, gen = _generate(model, prompt, truth, audit=1.0, progress=None)
    assert out == truth
    audit = gen.stats()["exact_audit"]
    assert audit.audited == audit.verifications > 0 and audit.mismatches == 0 and audit.divergence is None
    assert "all bit-identical" in audit.summary()


@pytest.mark.parametrize("rate", [-0.1, 1.5, float("nan")])
def test_audit_rate_outside_0_1_is_one_clear_error_before_model_work(model, rate):
    exact_calibration._calibrations.clear()
    _forget_stored(model)
    with pytest.raises(ValueError, match=r"^audit must be a rate in \[0, 1\]") as err:
        speculative_generate(model, [1, 2, 3], GenerateOptions(audit=rate), drafter=ScriptedDrafter([], 3, 97))
    assert "\n" not in str(err.value)
    assert load_calibration(model) is None  # nothing calibrated


def test_audit_with_fast_verification_is_one_clear_error():
    with pytest.raises(ValueError, match="verify='exact' or audit=0"):
        GenerateOptions(audit=0.5, verify="fast").check()
    with pytest.raises(TypeError, match="audit must be a rate"):
        GenerateOptions(audit="all").check()


def _stored_file(model):
    path = exact_calibration._calibration_path(calibration_key(model))
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


@pytest.mark.parametrize("damage", ["truncated", "foreign"])
def test_damaged_or_foreign_calibration_is_set_aside_in_one_line_and_output_stays_exact(
    monkeypatch, model, prompt, damage
):
    """A researcher expects a stored calibration that cannot be trusted to be made anew, not to stop the run: it is
    moved aside with one warning naming it (and why), and the generation calibrates again."""
    prompt = prompt[:40]
    truth = plain_greedy(model, prompt, TOKENS)
    _forget_stored(model)
    _generate(model, prompt, truth, progress=None)  # a good file, made here
    path = _stored_file(model)
    text = path.read_text(encoding="utf-8")
    if damage == "truncated":
        path.write_text(text[: len(text) // 2], encoding="utf-8")
    else:  # made on another device with another driver: its key differs, copied under this one's name
        data = json.loads(text)
        data.update(key="qwen3-0123456789ab-ffffffffff", device="gpu:NVIDIA H100 80GB HBM3")
        for width in data["widths"].values():
            width["level"] = "none"  # what it picked there, wrong here
        path.write_text(json.dumps(data), encoding="utf-8")
    exact_calibration._calibrations.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out, _ = _generate(model, prompt, truth, progress=None)
    assert out == truth
    lines = [str(w.message) for w in caught if issubclass(w.category, DamagedFileWarning)]
    assert len(lines) == 1 and "\n" not in lines[0] and str(path) in lines[0]
    assert ("is damaged (JSONDecodeError" if damage == "truncated" else "is foreign (made for qwen3-") in lines[0]
    assert list(path.parent.glob(f"{path.name}.damaged-*"))
    assert load_calibration(model).key == calibration_key(model)  # calibrated anew, under this key


def test_calibration_key_names_the_cuda_libraries_as_mlx_reports_them(monkeypatch, model):
    monkeypatch.setattr(mx, "default_device", lambda: mx.Device(mx.gpu))
    monkeypatch.setattr(mx.cuda, "is_available", lambda: True)
    reported = {"device_name": "NVIDIA H100", "architecture": "sm_90", "driver_version": "12080"}
    monkeypatch.setattr(mx, "device_info", lambda: dict(reported))
    monkeypatch.setattr(identity, "_loaded_version", lambda libraries, function, packages: f"{function}-9")
    found = identity.cuda_libraries()
    assert found == {
        "architecture": "sm_90",
        "driver": "12080",  # as MLX reports it
        "cuda": "cudaRuntimeGetVersion-9",  # as the loaded library reports it
        "cudnn": "cudnnGetVersion-9",
    }
    keys = []
    for driver in ("12080", "13000"):
        reported["driver_version"] = driver
        monkeypatch.setattr(exact_calibration, "_keys", {})
        monkeypatch.setattr(exact_calibration.kernels, "source_digest", lambda: "same")
        keys.append(calibration_key(model))
    assert keys[0] != keys[1]  # another driver: another calibration
    monkeypatch.undo()
    assert identity.cuda_libraries() == {}  # on the CPU: none


def test_a_sweep_records_the_diverging_operation_and_the_verdict_names_it(monkeypatch, model, prompt):
    """What the report's quickstart and sweep verdicts print: the audited sweep's runs carry the first diverging
    operation (``exact_divergence``), the summary keeps it, and the verdict names it."""
    from specbench.bench import sweep
    from specbench.report import verdicts

    _forget_stored(model)
    emulate_gpu(monkeypatch, attention=True, linear_rows=None, beyond_keys=4 * PROMPT)
    calibrate(model, range(2, K + 2), lengths=lengths_for(PROMPT + TOKENS), measure=False)
    monkeypatch.setitem(BUMP, "beyond_keys", BEYOND)
    truth = plain_greedy(model, prompt, TOKENS)
    with pytest.raises(ValueError, match=r"audit must be a rate in \[0, 1\]"):
        sweep.run_sweep(model, None, [prompt], drafters=[], audit=2.0, progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExactAuditWarning)
        result = sweep.run_sweep(
            model,
            None,
            [prompt],
            drafters=[],
            policies=[f"fixed:{K}"],
            max_tokens=TOKENS,
            progress=False,
            drafter_factories={"scripted": lambda: ScriptedDrafter(truth, len(prompt), 97)},
            warmup_tokens=0,
            audit=1.0,
        )
    runs = result.runs.filter(pl.col("drafter") == "scripted")
    assert runs["equal_to_plain"].to_list() == [True]
    named = runs["exact_divergence"][0]
    assert named.startswith(f"layer 0 self_attn.scaled_dot_product_attention at width {K + 1}, cache length {PROMPT}")
    summary = result.summary()
    assert summary.filter(pl.col("drafter") == "scripted")["exact_divergence"][0] == named
    text = verdicts.quickstart("tiny", summary, TOKENS, True)
    assert f"first diverging operation {named}" in text and "output equal to plain decoding's" in text
