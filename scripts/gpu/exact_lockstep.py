"""Exact verification replayed in lockstep with serial decoding: the serial KV layout switched off (the first GPU
run's code) or on, a speculative run's verifications compared row by row with serial steps on a serially built
cache, and at the first that differs, the layer whose output first differs in four variants of the same
verification. Used by scripts/gpu/exact_diagnose.py.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx_lm.models.cache import make_prompt_cache

from scripts.gpu.exact_layout import Snapshot, bits, same
from scripts.gpu.exactness_workload import timed_oracle
from specbench.core.log import StepLog, StepRecord
from specbench.exact import calibration_key, exact_mode, hooks
from specbench.exact.calibration import Calibration, _calibrations

#: The serial KV layout's two hooks, and the first GPU run's stand-ins (no layout, rows sliced).
SERIAL_LAYOUT = hooks.serial_kv_layout, hooks._serial_kv_row
NO_LAYOUT = (lambda cache, width=1: None), (lambda k, v, n: (k[..., :n, :], v[..., :n, :]))


@contextlib.contextmanager
def layout(on: bool) -> Iterator[None]:
    """Exact mode with (on) or without (off: the first GPU run's code) the serial KV layout: in
    the split forwards and before the engine's plain steps (``hooks.SplitVerifier``)."""
    saved = hooks.serial_kv_layout, hooks._serial_kv_row
    hooks.serial_kv_layout, hooks._serial_kv_row = SERIAL_LAYOUT if on else NO_LAYOUT
    try:
        yield
    finally:
        hooks.serial_kv_layout, hooks._serial_kv_row = saved


def run_exact(
    model: nn.Module,
    prompt: Sequence[int],
    truth: Sequence[int],
    tokens: int,
    k: int,
    seed: int,
    on: bool,
    calibrations: dict[bool, Calibration],
) -> tuple[list[int], StepLog]:
    """Exact speculative decoding drafted by the oracle following ``truth`` at acceptance 0.8, the serial layout
    ``on`` or off, with the calibration made for that layout (``calibrations[on]``): the tokens and the log."""
    _calibrations[calibration_key(model)] = calibrations[on]
    with layout(on):
        out, _, log = timed_oracle(model, prompt, truth, tokens, k, "exact", 0.8, seed=seed)
    return out, log


class Taps:
    """Records every decoder layer's output (rows joined in call order)."""

    def __init__(self, model: nn.Module):
        self.layers = model.model.layers
        self.out: dict[int, list[mx.array]] = {}

    def __enter__(self) -> Taps:
        self.originals = list(self.layers)
        for i, layer in enumerate(self.originals):

            def tap(*args, _layer=layer, _i=i, **kwargs):
                h = _layer(*args, **kwargs)
                self.out.setdefault(_i, []).append(h.reshape(-1, h.shape[-1]))
                return h

            self.layers[i] = tap
        return self

    def __exit__(self, *exc: object) -> bool:
        for i, layer in enumerate(self.originals):
            self.layers[i] = layer
        return False

    def rows(self) -> dict[int, np.ndarray]:
        """Each layer's outputs, [rows, hidden], as float32 numpy."""
        return {i: bits(mx.concatenate(parts, axis=0)) for i, parts in self.out.items()}


def serial_rows(
    model: nn.Module, cache: list[Any], inputs: Sequence[int], taps: bool = False
) -> tuple[np.ndarray, dict[int, np.ndarray] | None]:
    """Logits [w, V] of serial single-token steps (and each layer's outputs)."""
    out = []
    with Taps(model) if taps else contextlib.nullcontext() as t:
        for tok in inputs:
            logits = model(mx.array([[tok]], dtype=mx.uint32), cache=cache)
            mx.eval(logits)
            out.append(bits(logits[0, 0]))
    return np.stack(out), (t.rows() if taps else None)


def verify_rows(
    model: nn.Module, cache: list[Any], inputs: Sequence[int], taps: bool = False
) -> tuple[np.ndarray, dict[int, np.ndarray] | None]:
    """Logits [w, V] of one exact-mode forward of ``inputs`` (and each layer's outputs)."""
    with Taps(model) if taps else contextlib.nullcontext() as t:
        with exact_mode(model):
            logits = model(mx.array([inputs], dtype=mx.uint32), cache=cache)
            mx.eval(logits)
    return bits(logits[0]), (t.rows() if taps else None)


def row_report(
    ref: np.ndarray,
    ref_layers: dict[int, np.ndarray] | None,
    got: np.ndarray,
    got_layers: dict[int, np.ndarray] | None,
    first_keys: int,
) -> list[str]:
    """Per row: '=' equal, else 'L<i>' the first layer whose output differs ('head' if none did)."""
    marks = []
    for r in range(ref.shape[0]):
        if np.array_equal(ref[r], got[r]):
            marks.append("=")
            continue
        layer = "head"
        if ref_layers and got_layers:
            for i in sorted(ref_layers):
                if not np.array_equal(ref_layers[i][r], got_layers[i][r]):
                    layer = f"L{i}"
                    break
        marks.append(f"{first_keys + r}:{layer}")
    return marks


def lockstep(
    model: nn.Module,
    prompt: Sequence[int],
    log_records: Sequence[StepRecord],
    on: bool,
    calibrations: dict[bool, Calibration],
    analyse: bool,
) -> dict[str, Any]:
    """Replay a speculative run (its log's records) next to serial decoding of the same accepted tokens: the first
    verification whose logits differ from serial steps (its offset, width, buffer lengths, whether the caches
    still held equal contents, the rows differing; ``analyse`` adds ``analyse_step``), or {"verify": None} with
    the verifications checked."""
    _calibrations[calibration_key(model)] = calibrations[on]
    spec, ser = make_prompt_cache(model), make_prompt_cache(model)
    p = mx.array(prompt, dtype=mx.uint32)
    for cache in (spec, ser):
        if len(prompt) > 1:
            model(p[None, :-1], cache=cache)
        mx.eval(model(p[None, -1:], cache=cache))
    y = None
    checked = 0
    with layout(on):
        for rec in log_records:
            if rec.kind == "prefill":
                y = rec.tokens[-1]
                continue
            if rec.kind == "plain":
                for cache in (spec, ser):
                    mx.eval(model(mx.array([[y]], dtype=mx.uint32), cache=cache))
                y = rec.tokens[-1] if rec.tokens else y
                continue
            inputs = [y, *rec.draft_tokens]
            keep = rec.accepted + 1
            before_spec, before_ser = Snapshot(spec), Snapshot(ser)
            ref, _ = serial_rows(model, before_ser.cache(), inputs)
            got, _ = verify_rows(model, spec, inputs)
            checked += 1
            if not np.array_equal(ref, got):
                result = {
                    "verify": checked,
                    "offset": before_spec.offset,
                    "width": len(inputs),
                    "keys_per_row": [before_spec.offset + 1, before_spec.offset + len(inputs)],
                    "extent_speculative": before_spec.extent,
                    "extent_serial": before_ser.extent,
                    "contents_equal_before": all(
                        same(a[0], b[0]) and same(a[1], b[1]) for a, b in zip(before_spec.kv, before_ser.kv)
                    ),
                    "rows_differing": int(sum(not np.array_equal(ref[r], got[r]) for r in range(len(inputs)))),
                }
                if analyse:
                    result.update(analyse_step(model, before_spec, before_ser, inputs, calibrations))
                return result
            spec_keep = spec
            for c in spec_keep:
                c.trim(len(inputs) - keep)
            serial_rows(model, ser, inputs[:keep])
            y = rec.tokens[-1]
    return {"verify": None, "verifies_checked": checked}


def analyse_step(
    model: nn.Module, spec: Snapshot, ser: Snapshot, inputs: Sequence[int], calibrations: dict[bool, Calibration]
) -> dict[str, list[str]]:
    """One verification that differed, four ways, each row marked by ``row_report``: (i) exact verify on the
    speculative cache, (ii) on the serially built cache, (iii) serial steps on the speculative cache (all three
    without the serial layout), (iv) exact verify with the serial layout on the speculative cache."""
    first = spec.offset + 1
    key = calibration_key(model)
    caller = _calibrations[key]
    ref, ref_l = serial_rows(model, ser.cache(), inputs, taps=True)
    out: dict[str, Any] = {}
    _calibrations[key] = calibrations[False]
    with layout(False):
        got, got_l = verify_rows(model, spec.cache(), inputs, taps=True)
        out["(i) exact verify, speculative cache"] = row_report(ref, ref_l, got, got_l, first)
        got, got_l = verify_rows(model, ser.cache(), inputs, taps=True)
        out["(ii) exact verify, serially built cache"] = row_report(ref, ref_l, got, got_l, first)
        got, got_l = serial_rows(model, spec.cache(), inputs, taps=True)
        out["(iii) serial steps, speculative cache"] = row_report(ref, ref_l, got, got_l, first)
    _calibrations[calibration_key(model)] = calibrations[True]
    with layout(True):
        got, got_l = verify_rows(model, spec.cache(), inputs, taps=True)
    _calibrations[key] = caller
    out["(iv) exact verify with serial layout, speculative cache"] = row_report(ref, ref_l, got, got_l, first)
    return out
