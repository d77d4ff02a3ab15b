"""The exactness workload of the device check (scripts/gpu/exactness.py): per prompt, mlx-lm's plain greedy
decoding against speculative greedy in exact and fast mode, drafted by the controlled-acceptance oracle; the
first prompts also timed end to end (cold and warm); the exact runs' steps replayed at each mode's measured
verify cost. Rows are plain dicts with the columns of the script's CSV files.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten

from specbench.bench.turn_cache import first_divergence
from specbench.checks import exactness
from specbench.core.log import StepLog, StepRecord

#: The workload's verify modes, exact first.
MODES = ("exact", "fast")
#: The same modes verifying token trees (``run_workload(tree_branches=...)``).
TREE_MODES = ("exact-tree", "fast-tree")
#: The columns of the per-mode summary table, in print order.
SUMMARY_KEYS = ["model", "dtype", "mode", "equal", "first_div_min", "first_div_median", "first_div_max"]


def dtype_label(model: nn.Module) -> str:
    """The model's weight types: "bfloat16", "float32", or "4bit+bfloat16" for a quantized one."""
    bits = {m.bits for _, m in model.named_modules() if hasattr(m, "bits") and hasattr(m, "group_size")}
    floats = {
        str(v.dtype).split(".")[-1] for _, v in tree_flatten(model.parameters()) if mx.issubdtype(v.dtype, mx.floating)
    }
    label = "/".join(sorted(floats))
    return f"{'/'.join(f'{b}bit' for b in sorted(bits))}+{label}" if bits else label


def is_moe(model: nn.Module) -> bool:
    """Whether the model routes tokens to experts (holds a switch layer)."""
    return any("Switch" in type(m).__name__ for _, m in model.named_modules())


def bundled_first_turns(tokenizer: Any) -> list[list[int]]:
    """The first turn of every bundled prompt, rendered through the chat template, category files in name order."""
    from specbench.inputs.prompts import PROMPTS_DIR, render_prompt

    texts = []
    for path in sorted(PROMPTS_DIR.glob("*.jsonl")):
        texts += [json.loads(line)["turns"][0] for line in path.read_text().splitlines() if line.strip()]
    return [render_prompt(tokenizer, text) for text in texts]


def timed_greedy(model: nn.Module, prompt: Sequence[int], tokens: int) -> tuple[list[int], float]:
    """mlx-lm's greedy decoding (the reference) and its wall seconds."""
    t0 = time.perf_counter()
    out = exactness.mlx_lm_greedy(model, prompt, tokens)
    return out, time.perf_counter() - t0


def timed_oracle(
    model: nn.Module,
    prompt: Sequence[int],
    continuation: Sequence[int],
    tokens: int,
    k: int,
    verify: str,
    acceptance: float,
    seed: int,
    branches: int = 1,
) -> tuple[list[int], float, StepLog]:
    """Speculative greedy decoding drafted by the oracle following ``continuation`` (token trees of ``branches``
    drafts when more than one): tokens, wall seconds, log."""
    t0 = time.perf_counter()
    generation = exactness.oracle_generation(
        model, prompt, continuation, tokens, k, verify, acceptance, seed=seed, branches=branches
    )
    out = list(generation)
    return out, time.perf_counter() - t0, generation.log


@dataclass
class Workload:
    """What one model's workload gives: a row per (prompt, mode), a summary row per mode, the measured end-to-end
    rows, and the exact runs' step records by draft length (for ``replay_rows``)."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    summary: list[dict[str, Any]] = field(default_factory=list)
    e2e: list[dict[str, Any]] = field(default_factory=list)
    logs: dict[str, list[StepRecord]] = field(default_factory=dict)


def exactness_row(
    label: str,
    dtype: str,
    mode: str,
    i: int,
    k: int,
    prompt: Sequence[int],
    out: list[int],
    truth: list[int],
    log: StepLog,
) -> dict[str, Any]:
    """One (prompt, mode) row: equal to plain greedy, the first divergence, verifications and acceptance."""
    div = first_divergence(out, truth)
    stats = log.stats()
    return {
        **{"model": label, "dtype": dtype, "mode": mode, "prompt": i, "k": k},
        **{"prompt_tokens": len(prompt), "tokens": len(out), "equal": div is None, "first_divergence": div},
        **{"verifies": stats["verifies"], "accepted": stats["accepted"]},
        "mean_accepted_tokens": stats["mean_accepted_tokens"],
    }


def mode_summary(rows: list[dict[str, Any]], label: str, dtype: str) -> list[dict[str, Any]]:
    """Per mode: prompts equal ("3/4"), first divergence min / median / max, accepted drafts per verification."""
    summary = []
    for mode in MODES + TREE_MODES:
        mine = [r for r in rows if r["model"] == label and r["mode"] == mode]
        if not mine and mode in TREE_MODES:
            continue
        divs = [r["first_divergence"] for r in mine if r["first_divergence"] is not None]
        summary.append(
            {
                **{
                    "model": label,
                    "dtype": dtype,
                    "mode": mode,
                    "equal": f"{sum(r['equal'] for r in mine)}/{len(mine)}",
                },
                "first_div_min": min(divs) if divs else None,
                "first_div_median": statistics.median(divs) if divs else None,
                "first_div_max": max(divs) if divs else None,
                "accepted_per_verify": sum(r["accepted"] for r in mine) / max(1, sum(r["verifies"] for r in mine)),
            }
        )
    return summary


def all_equal(summary: list[dict[str, Any]]) -> bool:
    """Whether exact mode (paths and trees) equalled plain greedy on every prompt of every summarized model."""
    return all(r["equal"].split("/")[0] == r["equal"].split("/")[1] for r in summary if r["mode"].startswith("exact"))


def _timed_rows(per_k: dict[int, dict[str, Any]], label: str, dtype: str) -> list[dict[str, Any]]:
    rows = []
    for k, t in sorted(per_k.items()):
        for c in ("cold", "warm"):
            row = {
                **{"model": label, "dtype": dtype, "kind": f"measured-{c}", "k": k, "tokens": t["tokens"]},
                **{f"{m}_s": t[f"{m}_{c}"] for m in ("plain", "exact", "fast")},
                "speedup_exact": t[f"plain_{c}"] / t[f"exact_{c}"],
                "speedup_fast": t[f"plain_{c}"] / t[f"fast_{c}"],
                "mat_exact": statistics.mean(t["mat_exact"]),
                "mat_fast": statistics.mean(t["mat_fast"]),
            }
            row["exact_over_fast"] = row["speedup_exact"] / row["speedup_fast"]
            rows.append(row)
    return rows


def run_workload(
    model: nn.Module,
    label: str,
    dtype: str,
    prompts: Sequence[Sequence[int]],
    tokens: int,
    ks: Sequence[int],
    acceptance: float,
    e2e_prompts: int = 0,
    tree_branches: int = 0,
) -> Workload:
    """Every prompt decoded plain and speculatively in both modes (prompt i drafts ``ks[i % len(ks)]``), after a
    warm-up of every kernel the runs use; with ``tree_branches`` also drafted as token trees of that many oracle
    drafts of ``k`` tokens (``exactness.tree_nodes`` nodes; modes "exact-tree" and "fast-tree"). The first
    ``e2e_prompts`` prompts are also timed end to end, each mode cold (its first run) then warm (an identical
    second run), fast drafting from its own output (so its acceptance is not cut by its divergences)."""
    warm = prompts[0]
    truth, _ = timed_greedy(model, warm, 8)
    shapes = [1] + ([tree_branches] if tree_branches > 1 else [])
    for k in ks:
        for verify in MODES:
            for branches in shapes:
                timed_oracle(model, warm, truth, 8, k, verify, acceptance, seed=0, branches=branches)
    result = Workload()
    per_k: dict[int, dict[str, Any]] = {}
    for i, prompt in enumerate(prompts):
        k = ks[i % len(ks)]
        truth, plain_s = timed_greedy(model, prompt, tokens)
        exact_out, exact_s, exact_log = timed_oracle(model, prompt, truth, tokens, k, "exact", acceptance, seed=i)
        fast_out, _, fast_log = timed_oracle(model, prompt, truth, tokens, k, "fast", acceptance, seed=i)
        for mode, out, log in (("exact", exact_out, exact_log), ("fast", fast_out, fast_log)):
            result.rows.append(exactness_row(label, dtype, mode, i, k, prompt, out, truth, log))
        result.logs.setdefault(str(k), []).extend(exact_log.records)
        if tree_branches > 1:
            nodes = exactness.tree_nodes(k, tree_branches)
            for verify in MODES:
                out, _, log = timed_oracle(model, prompt, truth, tokens, k, verify, acceptance, i, tree_branches)
                result.rows.append(exactness_row(label, dtype, f"{verify}-tree", i, nodes, prompt, out, truth, log))
        if i >= e2e_prompts:
            continue
        _, fast_cold_s, _ = timed_oracle(model, prompt, fast_out, tokens, k, "fast", acceptance, seed=i)
        _, plain_warm_s = timed_greedy(model, prompt, tokens)
        _, exact_warm_s, _ = timed_oracle(model, prompt, truth, tokens, k, "exact", acceptance, seed=i)
        _, fast_warm_s, fast_warm_log = timed_oracle(model, prompt, fast_out, tokens, k, "fast", acceptance, seed=i)
        t = per_k.setdefault(
            k,
            {
                "tokens": 0,
                "mat_exact": [],
                "mat_fast": [],
                **{f"{m}_{c}": 0.0 for m in MODES + ("plain",) for c in ("cold", "warm")},
            },
        )
        for key, value in (("plain_cold", plain_s), ("exact_cold", exact_s), ("fast_cold", fast_cold_s)):
            t[key] += value
        for key, value in (("plain_warm", plain_warm_s), ("exact_warm", exact_warm_s), ("fast_warm", fast_warm_s)):
            t[key] += value
        t["tokens"] += len(truth)
        t["mat_exact"].append(exact_log.stats()["mean_accepted_tokens"])
        t["mat_fast"].append(fast_warm_log.stats()["mean_accepted_tokens"])
    result.summary = mode_summary(result.rows, label, dtype)
    result.e2e = _timed_rows(per_k, label, dtype)
    return result


def replay_cost(records: Sequence[StepRecord], ratio: dict[int, float]) -> tuple[int, float]:
    """(decode tokens, cost in width-1 forwards) of a run's steps at the given cost ratio per verify width
    (interpolated between measured widths)."""
    widths = sorted(ratio)
    tokens, total = 0, 0.0
    for r in records:
        if r.kind == "prefill":
            continue
        tokens += r.emitted
        total += float(np.interp(r.verify_width, widths, [ratio[w] for w in widths]))
    return tokens, total


def replay_rows(
    label: str, logs: dict[str, list[StepRecord]], seconds: dict[str, dict[int, float]]
) -> list[dict[str, Any]]:
    """The exact runs' steps priced at fast and exact mode's measured verify seconds (``seconds[mode][width]``,
    as ``scripts.gpu.verify_calls.level_seconds`` gives them): the same steps for both, so the ratio is the verify
    cost's alone. A draft length whose widest step was not measured is left out."""
    base = seconds["fast"][1]
    ratios = {mode: {w: s / base for w, s in seconds[mode].items()} for mode in ("fast", "exact")}
    rows = []
    for k, records in logs.items():
        if max(r.verify_width for r in records if r.kind != "prefill") > max(ratios["fast"]):
            continue
        tokens, fast_cost = replay_cost(records, ratios["fast"])
        _, exact_cost = replay_cost(records, ratios["exact"])
        row = {"model": label, "kind": "replay", "k": int(k), "tokens": tokens}
        row |= {"speedup_exact": tokens / exact_cost, "speedup_fast": tokens / fast_cost}
        row["exact_over_fast"] = row["speedup_exact"] / row["speedup_fast"]
        rows.append(row)
    return rows


def cost_rows(
    label: str, dtype: str, seconds: dict[str, dict[int, float]], chosen: dict[int, str]
) -> list[dict[str, Any]]:
    """One row per (level, width): seconds and ratio to the fast width-1 forward; the "exact" level's rows name the
    calibrated level of their width (``chosen``; "none" where the width was not calibrated)."""
    base = seconds["fast"][1]
    return [
        {
            **{"model": label, "dtype": dtype, "level": level, "width": w, "seconds": s, "ratio": s / base},
            "exact_level": chosen.get(w, "none") if level == "exact" else None,
        }
        for level, per in seconds.items()
        for w, s in per.items()
    ]


def not_row_invariant(op_rows: Sequence[dict[str, Any]]) -> list[str]:
    """The ops the op probe (``specbench.exact.probe_ops``) found not row-invariant, as "op[dtype]", sorted."""
    return sorted({f"{r['op']}[{r['dtype']}]" for r in op_rows if not r["row_invariant"]})


def summary(results: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """What summary.json keeps of a run's rows (by name: "exactness_summary", "e2e", "skipped", "calibration",
    "ops"): the per-mode summaries, end-to-end rows, skipped models, the calibrated level per model and width,
    and the ops found not row-invariant."""
    calibration = results["calibration"]
    return {
        "exactness": results["exactness_summary"],
        "e2e": results["e2e"],
        "skipped": results["skipped"],
        "levels": {
            model: {r["width"]: r["chosen"] for r in calibration if r["model"] == model}
            for model in dict.fromkeys(r["model"] for r in calibration)
        },
        "ops_not_row_invariant": not_row_invariant(results["ops"]),
    }


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"
    return "" if value is None else str(value)


def text_table(rows: Sequence[dict[str, Any]], keys: Sequence[str]) -> str:
    """``rows`` as aligned text columns ``keys`` (floats to 3 significant digits), a header line first; empty
    without rows."""
    if not rows:
        return ""
    width = {k: max(len(k), *(len(_cell(r.get(k))) for r in rows)) for k in keys}
    lines = ["  ".join(k.ljust(width[k]) for k in keys)]
    lines += ["  ".join(_cell(r.get(k)).ljust(width[k]) for k in keys) for r in rows]
    return "\n".join(lines) + "\n"


def print_table(rows: Sequence[dict[str, Any]], keys: Sequence[str], say: Callable[[str], None] = print) -> None:
    """``text_table`` printed (nothing without rows)."""
    if rows:
        say(text_table(rows, keys))
