"""Are the one-row kernels MLX's own products on a model's real activations, and where does exact mode calibrate?

    python3 -m scripts.gpu.one_row_diagnose                   # H200: the MoE Qwen3-30B-A3B shape, 4-bit, full depth
    python3 -m scripts.gpu.one_row_diagnose --quick           # CPU: a tiny shape (no kernel runs; the flow only)

1. the LM head's one-row product timed through MLX and through the kernel (``time_one_row``: also bit for bit on
   random rows), then compared bit for bit on the model's real final hidden states, row by row;
2. whole plain steps' logits with and without the head's kernel (``plain_logits``: what ``one_row_choice`` checks);
3. width ``--width`` calibrated (first exact level per family) outside and inside the one-row kernels' context, the
   head's kernel forced on, and on its first use inside a verify forward in that context (as during generation).

Writes one_row_diagnose.json to $OUT (default reports/gpu/one_row_diagnose) and prints each step as it ends.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import make_prompt_cache

from specbench.common.identity import device_name, write_result
from specbench.core.forward import vocab_size
from specbench.exact import calibrate, exact_mode, load_calibration
from specbench.exact import calibration as exact_calibration
from specbench.exact.kernel_calls import kernel_product
from specbench.exact.one_row import OneRowChoice, ShapeTiming, one_row_kernels, plain_logits, signature, time_one_row
from specbench.models import synthetic


def real_rows(model: Any, rows: int, seed: int) -> list[dict[str, Any]]:
    """The head's kernel against MLX's one-row product on the final hidden states of ``rows`` real positions."""
    rng = np.random.default_rng(seed)
    vocab = vocab_size(model)
    cache = make_prompt_cache(model)
    mx.eval(model(mx.array(rng.integers(0, vocab, size=(1, 40)), dtype=mx.uint32), cache=cache))
    hidden = model.model(mx.array(rng.integers(0, vocab, size=(1, rows)), dtype=mx.uint32), cache=cache)
    found = []
    for i in range(rows):
        row = hidden[:, i : i + 1]
        mlx_row, kernel_row = model.lm_head(row), kernel_product(model.lm_head, row)
        if kernel_row is None:
            found.append({"row": i, "kernel": None})
            continue
        diff = mx.abs(mlx_row.astype(mx.float32) - kernel_row.astype(mx.float32))
        found.append(
            {"row": i, "identical": bool(mx.array_equal(mlx_row, kernel_row)), "differing": int((diff > 0).sum())}
        )
    return found


def levels(calibration: Any, width: int) -> list[tuple[str, bool]]:
    return [(t["level"], t["exact"]) for t in calibration.rows() if t["width"] == width]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a tiny shape on the CPU")
    parser.add_argument("--shape", default=None, help="synthetic shape (default qwen3-30b-a3b; quick: its tiny twin)")
    parser.add_argument("--width", type=int, default=5, help="the verify width calibrated (default 5)")
    args = parser.parse_args()
    if args.width < 2:
        raise SystemExit(f"--width must be >= 2, got {args.width}")
    out = Path(os.environ.get("OUT") or "reports/gpu/one_row_diagnose")
    t0 = time.perf_counter()
    shape = args.shape or ("qwen3-30b-a3b-tiny" if args.quick else "qwen3-30b-a3b")
    model = synthetic.build(shape) if args.quick else synthetic.build(shape, layers=None, bits=4)
    report: dict[str, Any] = {"device": device_name(), "shape": shape, "width": args.width}

    def say(key: str, value: Any) -> None:
        report[key] = value
        write_result(out / "one_row_diagnose.json", report)
        print(f"[{time.perf_counter() - t0:5.0f} s] {key}: {value}", flush=True)

    timing = time_one_row(model.lm_head)
    say("head_timing", {"mlx_s": timing.mlx_s, "kernel_s": timing.kernel_s, "random_rows_identical": timing.identical})
    say("head_on_real_rows", real_rows(model, 6, seed=1))
    forced = OneRowChoice([ShapeTiming(signature(model.lm_head), 1, 1.0, 0.5, True)], 0.0, 0.0)
    reference = plain_logits(model)
    with one_row_kernels(model, forced):
        through = plain_logits(model)
    say("plain_logits_identical", [bool(mx.array_equal(a, b)) for a, b in zip(reference, through)])
    outside = calibrate(model, [args.width], force=True, save=False, measure=False)
    say("calibrated_outside", {"level": outside.level_for(args.width), "tests": levels(outside, args.width)})
    with one_row_kernels(model, forced):
        inside = calibrate(model, [args.width], force=True, save=False, measure=False)
    say("calibrated_inside", {"level": inside.level_for(args.width), "tests": levels(inside, args.width)})
    exact_calibration._calibrations.clear()  # the unsaved calibrations above: not the stored table
    cache = make_prompt_cache(model)
    mx.eval(model(mx.array([list(range(1, 33))]), cache=cache))
    stored = load_calibration(model)
    if stored is None or args.width not in stored.widths:  # calibrated on its first use, as during generation
        with one_row_kernels(model, forced), exact_mode(model):
            mx.eval(model(mx.array([list(range(5, 5 + args.width))]), cache=cache))
        found = load_calibration(model)
        say("on_first_use", {"level": found.level_for(args.width), "tests": levels(found, args.width)})
    else:
        say("on_first_use", f"width {args.width} was stored already: not calibrated on first use")
    say("elapsed_s", round(time.perf_counter() - t0, 1))


if __name__ == "__main__":
    main()
