"""The embedded SmolLM2-135M on the device: set-up time, greedy answers, decode speed, and how far the stored
float16 weights (computed in float16 on a GPU) and bfloat16 drift from float32 logits.

    python3 -m scripts.gpu.embedded            # H200: float16 (stored), bfloat16, float32; 3 prompts x 32 tokens
    python3 -m scripts.gpu.embedded --quick    # CPU: float32 and float16, 1 prompt x 8 tokens (seconds)

Writes into $OUT (default reports/gpu): embedded.json, embedded.csv; prints a compact table.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import time
from pathlib import Path

import mlx.core as mx
from mlx_lm import stream_generate

from specbench.models import load as models

PROMPTS = [
    "What is the capital of France?",
    "Write a Python function that checks whether a number is prime.",
    "Give me three tips for sleeping better.",
]
LOGIT_TEXT = (
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    "<|im_start|>user\nExplain speculative decoding in two sentences.<|im_end|>\n<|im_start|>assistant\n"
    "Speculative decoding lets a small draft model propose several tokens that the large model then checks "
    "in a single forward pass, keeping only the tokens it agrees with."
)


def residual_max(model, ids: mx.array) -> float:
    """Largest |activation| in the residual stream (float16 overflows past 65504)."""
    h = model.model.embed_tokens(ids)
    peak = mx.abs(h).max()
    for layer in model.model.layers:
        h = layer(h, mask="causal", cache=None)
        peak = mx.maximum(peak, mx.abs(h).max())
    return float(peak.astype(mx.float32).item())


def run(dtype: str, prompts: list[str], max_tokens: int, reference_logits: mx.array | None):
    start = time.perf_counter()
    model, tokenizer = models.load("smollm2-135m", dtype=None if dtype == "stored" else dtype)
    load_s = time.perf_counter() - start
    weight_dtype = str(model.model.embed_tokens.weight.dtype).removeprefix("mlx.core.")
    ids = mx.array(tokenizer.encode(LOGIT_TEXT))[None]
    logits = model(ids).astype(mx.float32)
    mx.eval(logits)
    row = {
        "dtype": dtype,
        "weights": weight_dtype,
        "load_s": round(load_s, 3),
        "residual_max": residual_max(model, ids),
        "finite": bool(mx.isfinite(logits).all().item()),
    }
    if reference_logits is not None:
        row["max_abs_logit_diff_vs_fp32"] = mx.abs(logits - reference_logits).max().item()
        row["argmax_agree_vs_fp32"] = mx.mean(logits.argmax(-1) == reference_logits.argmax(-1)).item()
    answers = []
    for question in prompts:
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True)
        for _ in stream_generate(model, tokenizer, prompt, max_tokens=4):  # warm-up
            pass
        text = ""
        for response in stream_generate(model, tokenizer, prompt, max_tokens=max_tokens):
            text += response.text
        answers.append(
            {
                "prompt": question,
                "text": text,
                "tokens": response.generation_tokens,
                "prompt_tps": round(response.prompt_tps, 1),
                "decode_tps": round(response.generation_tps, 1),
            }
        )
    row["decode_tps_median"] = sorted(a["decode_tps"] for a in answers)[len(answers) // 2]
    row["paris"] = "Paris" in answers[0]["text"]
    return row, answers, logits


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny settings for a CPU check")
    args = parser.parse_args()
    out = Path(os.environ.get("OUT") or "reports/gpu")
    out.mkdir(parents=True, exist_ok=True)
    prompts, max_tokens = (PROMPTS[:1], 8) if args.quick else (PROMPTS, 32)
    dtypes = ["float32", "float16"] if args.quick else ["float32", "stored", "bfloat16"]

    start = time.perf_counter()
    folder = models.setup()[0]
    setup_s = time.perf_counter() - start
    marker = json.loads((folder / "specbench-model.json").read_text())
    size_mb = sum(p.stat().st_size for p in folder.iterdir()) / 2**20

    rows, answers, reference = [], {}, None
    for dtype in dtypes:
        row, texts, logits = run(dtype, prompts, max_tokens, reference)
        reference = logits if dtype == "float32" else reference
        rows.append(row)
        answers[dtype] = texts

    result = {
        "device": str(mx.default_device()),
        "mlx": mx.__version__,
        "setup_s": round(setup_s, 2),
        "build_seconds": marker.get("build_seconds"),
        "folder_mb": round(size_mb, 1),
        "rows": rows,
        "answers": answers,
    }
    (out / "embedded.json").write_text(json.dumps(result, indent=2))
    keys = list(dict.fromkeys(k for row in rows for k in row))
    with open(out / "embedded.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=keys)
        writer.writeheader()
        writer.writerows(rows)

    print(
        f"device {result['device']}  setup {setup_s:.2f}s (build {marker.get('build_seconds')}s)  "
        f"folder {size_mb:.0f} MB"
    )
    print(
        f"{'dtype':9s} {'weights':9s} {'load_s':>7s} {'decode/s':>9s} {'|h|max':>9s} {'dlogit':>8s} {'argmax':>7s} ok"
    )
    for r in rows:
        print(
            f"{r['dtype']:9s} {r['weights']:9s} {r['load_s']:7.2f} {r['decode_tps_median']:9.1f} "
            f"{r['residual_max']:9.0f} {r.get('max_abs_logit_diff_vs_fp32', 0):8.4f} "
            f"{r.get('argmax_agree_vs_fp32', 1):7.3f} {r['finite'] and r['paris']}"
        )
    for dtype, texts in answers.items():
        print(f"[{dtype}] {texts[0]['text']!r}")
    return 0 if all(r["finite"] and r["paris"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
