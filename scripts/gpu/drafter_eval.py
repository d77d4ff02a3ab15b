"""Measuring drafters of one target on a held-out split (``draft_training.heldout_split``): per-position acceptance
and tokens per verification per kind, plain decoding's seconds, a draft model through specbench and through mlx-lm's
speculative_generate_step, and the Markdown tables of scripts/gpu/drafters.py's report.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import mlx.nn as nn
import numpy as np

from scripts.gpu.budget import Budget
from scripts.gpu.draft_training import HELDOUT_KINDS
from specbench.bench.prompt_runs import run_mlx_lm, run_specbench
from specbench.core.engine import plain_generation
from specbench.core.options import GenerateOptions
from specbench.core.policies import DraftPolicy
from specbench.drafters import DraftModel, EarlyExit, exit_layer_count
from specbench.inputs.prompts import bundled_questions, render_prompt
from specbench.train.mtp_training import evaluate_decoding

#: Draft length of every evaluation (fixed; fast verification).
K = 3
#: Targets for an MTP head: position 1, and positions 2 and 3 (cumulative), on every kind.
TARGETS = (0.55, 0.35, 0.35)
Say = Callable[[str], None]


def _quiet(text: str) -> None:
    """Say nothing."""


def evaluate(
    name: str, model: nn.Module, split: dict[str, Any], tokens: int, factory: Callable[[], Any], say: Say = _quiet
) -> dict[str, dict[str, Any]]:
    """Per kind: ``evaluate_decoding``'s metrics, and the drafter's weight bytes per drafted token over a plain
    step's (``cost_per_token``)."""
    rows = {}
    bytes_share = factory().cost_per_token
    for kind in HELDOUT_KINDS:
        rows[kind] = r = evaluate_decoding(model, split["prompts"][kind], tokens, K, "fast", drafter_factory=factory)
        r["cost_per_token"] = bytes_share
        say(
            f"{name:14s} {kind:8s} per position "
            + " ".join(f"{p:.2f}" for p in r["per_position_acceptance"])
            + "  conditional "
            + " ".join(f"{p:.2f}" for p in r["conditional_acceptance"])
            + f"  tokens/verify {r['tokens_per_verify']:.2f}  {r['seconds']:.1f}s"
        )
    return rows


def score(rows: dict[str, dict[str, Any]]) -> float:
    """Mean tokens per verification over the kinds (what decides which head ships)."""
    return float(np.mean([rows[kind]["tokens_per_verify"] for kind in HELDOUT_KINDS]))


def sweep_exit_layers(
    model: nn.Module,
    prompts: Sequence[Sequence[int]],
    layers: Iterable[int] | None = None,
    k: int = 3,
    max_tokens: int = 32,
) -> list[dict[str, Any]]:
    """``evaluate_decoding`` with ``EarlyExit(model, L)`` for each L in ``layers`` (default: every eighth of the
    depth), a fixed draft of ``k``: one row per L with its ``cost_per_token`` and ``modeled_speedup``, tokens per
    verification over the cost of a verification counted as one plain step plus k drafted tokens (a floor on what
    drafting costs: it assumes a verify pass costs one step)."""
    if not prompts:
        raise ValueError("the sweep needs at least one prompt")
    total = exit_layer_count(model)
    chosen = sorted(set(layers)) if layers is not None else sorted({max(1, total * i // 8) for i in range(1, 8)})
    rows = []
    for n in chosen:
        cost = EarlyExit(model, n).cost_per_token
        run = evaluate_decoding(model, prompts, max_tokens, k, drafter_factory=lambda n=n: EarlyExit(model, n))
        rows.append(
            {
                "layers": n,
                "of_layers": total,
                "k": k,
                **{key: run[key] for key in ("verifies", "first_draft_acceptance", "per_position_acceptance")},
                "tokens_per_verify": run["tokens_per_verify"],
                "cost_per_token": cost,
                "modeled_speedup": run["tokens_per_verify"] / (1 + k * cost),
            }
        )
    return rows


def best_exit_layer(rows: Sequence[dict[str, Any]]) -> int:
    """The L of a sweep's rows with the highest modeled speedup (below 1 at every L: early exit does not
    pay for this model, whichever L)."""
    if not rows:
        raise ValueError("no sweep rows")
    return max(rows, key=lambda r: r["modeled_speedup"] if r["verifies"] else -1.0)["layers"]


def meets_targets(rows: dict[str, dict[str, Any]]) -> bool:
    """Whether every kind's acceptance at positions 1-3 reaches ``TARGETS``."""
    return all(
        p >= t for kind in HELDOUT_KINDS for p, t in zip(rows[kind]["per_position_acceptance"], TARGETS, strict=True)
    )


def head_decision(new: dict[str, dict[str, Any]], shipped: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Whether a newly trained MTP head replaces the shipped one (a higher ``score``), both scores, whether the new
    head meets ``TARGETS``, and the decision in words."""
    wins, meets = score(new) > score(shipped), meets_targets(new)
    decision = (
        f"MTP head: new {score(new):.3f} vs shipped {score(shipped):.3f} mean tokens/verify over the kinds: "
        + ("the new head ships" if wins else "the shipped head stays")
        + f"; the new head {'meets' if meets else 'does not meet'} the targets "
        f"(position 1 >= {TARGETS[0]}, positions 2-3 >= {TARGETS[1]} on every kind)"
    )
    return {"new_score": score(new), "shipped_score": score(shipped), "new_meets_targets": meets, "ships": wins} | {
        "decision": decision
    }


def plain_seconds(
    model: nn.Module, split: dict[str, Any], max_tokens: int, say: Say = _quiet
) -> dict[str, dict[str, Any]]:
    """Per kind, plain decoding's seconds and tokens over the split's prompts, ``max_tokens`` each."""
    out = {}
    options = GenerateOptions(max_tokens=max_tokens)
    for kind in HELDOUT_KINDS:
        t0, emitted = time.perf_counter(), 0
        for prompt in split["prompts"][kind]:
            emitted += sum(1 for _ in plain_generation(model, list(prompt), options))
        out[kind] = {"seconds": round(time.perf_counter() - t0, 3), "tokens": emitted}
    say("plain: " + ", ".join(f"{k} {v['seconds']:.1f}s" for k, v in out.items()))
    return out


def versus_mlx_lm(
    model: nn.Module,
    tokenizer: Any,
    draft_model: nn.Module,
    prompts: dict[str, list[list[int]]],
    tokens: int,
    budget: Budget,
    say: Say = _quiet,
) -> dict[str, dict[str, Any]]:
    """The draft model through specbench (DraftModel, fixed k = 3) and through mlx-lm's
    speculative_generate_step (num_draft_tokens = 3), the same pair and prompts, greedy: tokens/s ratio,
    acceptance and whether the outputs are equal, per group of prompts. Both engines run once untimed
    first (kernel builds); a group that would overrun the budget (at the pace of the groups before) is
    skipped and recorded in ``budget``."""

    def specbench_run(prompt: list[int], max_tokens: int) -> Any:
        drafter = DraftModel(draft_model, target=model)
        return run_specbench(model, tokenizer, prompt, max_tokens, drafter, DraftPolicy.fixed(K), "fast")

    shortest = min((p for group in prompts.values() for p in group), key=len)[-8:]
    specbench_run(shortest, 2), run_mlx_lm(model, tokenizer, shortest, 2, draft_model, K)
    out, pace = {}, 0.0
    for group, group_prompts in prompts.items():
        if not budget.fits(f"versus mlx-lm:{group}", pace * len(group_prompts)):
            continue
        t0 = time.perf_counter()
        ours = [specbench_run(p, tokens) for p in group_prompts]
        theirs = [run_mlx_lm(model, tokenizer, p, tokens, draft_model, K) for p in group_prompts]
        pace = max(pace, 1.5 * (time.perf_counter() - t0) / len(group_prompts))

        def rate(runs: list[Any]) -> float:
            return sum(len(r.tokens) for r in runs) / max(sum(r.wall_s for r in runs), 1e-9)

        def acceptance(runs: list[Any]) -> float:
            return sum(r.accepted for r in runs) / max(sum(r.drafted for r in runs), 1)

        equal = sum(a.tokens == b.tokens for a, b in zip(ours, theirs, strict=True))
        out[group] = {
            "tokens_per_s_ratio": rate(ours) / rate(theirs),
            "specbench_tokens_per_s": rate(ours),
            "mlx_lm_tokens_per_s": rate(theirs),
            "specbench_acceptance": acceptance(ours),
            "mlx_lm_acceptance": acceptance(theirs),
            "prompts": len(group_prompts),
            "tokens": sum(len(r.tokens) for r in ours),
            "outputs_equal": equal,
        }
        say(f"draft-model vs mlx-lm {group}: " + ", ".join(f"{k} {v:.2f}" for k, v in out[group].items()))
    return out


def category_prompts(tokenizer: Any, per_category: int, last_tokens: int | None = None) -> dict[str, list[list[int]]]:
    """The bundled prompts' first turns with the chat template, by category (only their last
    ``last_tokens`` tokens when given: smoke runs)."""
    groups: dict[str, list[list[int]]] = {}
    for q in bundled_questions():
        if len(groups.setdefault(q.category, [])) < per_category:
            groups[q.category].append(render_prompt(tokenizer, q.turns[0])[-(last_tokens or 0) :])
    return groups


def rows_table(evaluation: dict[str, dict[str, dict[str, Any]]], plain: dict[str, dict[str, Any]]) -> list[str]:
    """Markdown rows per drafter and kind: acceptance per position, tokens per verification, speed and draft
    cost against plain decoding."""
    lines = [
        "| drafter | kind | pos 1 | pos 2 | pos 3 | cond 2 | cond 3 | tokens/verify | speed vs plain | draft s/token "
        "/ plain step |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, rows in evaluation.items():
        for kind, r in rows.items():
            p, c = r["per_position_acceptance"], r["conditional_acceptance"]
            base = plain.get(kind)
            speed = base["seconds"] / r["seconds"] if base and r["seconds"] else float("nan")
            step = base["seconds"] / max(base["tokens"], 1) if base else float("nan")
            d = r.get("draft_seconds_per_token", float("nan")) / step
            lines.append(
                f"| {name} | {kind} | {p[0]:.2f} | {p[1]:.2f} | {p[2]:.2f} | {c[1]:.2f} | {c[2]:.2f} | "
                f"{r['tokens_per_verify']:.2f} | {speed:.2f} | {d:.2f} |"
            )
    return lines


def report(results: dict[str, Any]) -> str:
    """The Markdown report of a run's results: the evaluation table, the head's decision, the early-exit sweep,
    the draft model against mlx-lm, and what was skipped."""
    lines = [
        "Greedy speculative decoding, fixed k = 3, fast verification, held-out split; acceptance of draft position "
        "1, 2, 3 (cumulative: share of verifications accepting that position; conditional: given the ones before); "
        "speed: plain decoding's seconds over the drafter's on the same prompts; draft cost: the drafter's seconds "
        "per drafted token over plain decoding's seconds per token.",
        "",
        *rows_table(results["evaluation"], results.get("plain", {})),
    ]
    head = results.get("mtp", {}).get("decision")
    if head:
        lines += ["", head]
    sweep = results.get("early_exit", {})
    if sweep.get("sweep"):
        lines += [
            "",
            "Early exit sweep (sample of the split): L, position-1 acceptance, tokens/verify, modelled speedup",
        ]
        lines += [
            f"- L = {r['layers']}/{r['of_layers']}: {r['first_draft_acceptance']:.2f}, {r['tokens_per_verify']:.2f}, "
            f"{r['modeled_speedup']:.2f}"
            for r in sweep["sweep"]
        ]
        lines.append(f"best L = {sweep['best_layers']}")
    if results.get("versus_mlx_lm"):
        lines += ["", *versus_table(results["versus_mlx_lm"])]
    if results.get("skipped"):
        lines += ["", "skipped (they would have overrun the budget): " + ", ".join(results["skipped"])]
    return "\n".join(lines)


def versus_table(versus: dict[str, dict[str, Any]]) -> list[str]:
    """Per kind and bundled category: the draft model through specbench and through mlx-lm."""
    lines = [
        "Draft model, the same pair through specbench (DraftModel, k = 3) and mlx-lm's speculative_generate_step "
        "(num_draft_tokens = 3), greedy, per held-out kind and bundled prompt category:",
        "",
        "| group | prompts | tokens | specbench / mlx-lm tokens/s | specbench tok/s | mlx-lm tok/s | "
        "specbench acceptance | mlx-lm acceptance | outputs equal |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for group, r in versus.items():
        equal = "yes" if r["outputs_equal"] == r["prompts"] else f"{r['outputs_equal']} of {r['prompts']}"
        lines.append(
            f"| {group} | {r['prompts']} | {r['tokens']} | {r['tokens_per_s_ratio']:.2f}x | "
            f"{r['specbench_tokens_per_s']:.1f} | {r['mlx_lm_tokens_per_s']:.1f} | {r['specbench_acceptance']:.2f} | "
            f"{r['mlx_lm_acceptance']:.2f} | {equal} |"
        )
    return lines


def compare_and_sweep(
    model: nn.Module,
    tokenizer: Any,
    split: dict[str, Any],
    settings: dict[str, Any],
    results: dict[str, Any],
    budget: Budget,
    draft: nn.Module,
    needs_s: dict[str, float],
    quick: bool = False,
    say: Say = _quiet,
) -> None:
    """Plain decoding on the split, ``draft`` through specbench and mlx-lm per kind and bundled category,
    and early exit: a sweep of exit layers on a sample of the split, the best L on the whole split; into ``results``
    ("plain", "versus_mlx_lm", "early_exit", "evaluation"). Each phase runs only if its ``needs_s`` seconds fit the
    budget. ``settings``: scripts/gpu/drafters.py's evaluation settings; ``quick`` keeps only the last
    ``prompt_tokens`` tokens of each category prompt."""
    if budget.fits("plain", needs_s["plain"]):
        results["plain"] = plain_seconds(model, split, settings["tokens"], say)
    last = settings["prompt_tokens"] if quick else None
    by_length = sorted(category_prompts(tokenizer, settings["per_category"], last).items(), key=lambda i: len(i[1][0]))
    categories = dict(by_length[: settings["categories"]])  # the shortest prompts first
    groups = {**{k: split["prompts"][k] for k in HELDOUT_KINDS[: settings["versus_kinds"]]}, **categories}
    if budget.fits("versus mlx-lm", needs_s["versus mlx-lm"]):
        results["versus_mlx_lm"] = versus_mlx_lm(model, tokenizer, draft, groups, settings["tokens"], budget, say)

    if budget.fits("early exit", needs_s["early exit"]):
        sample = [p for kind in HELDOUT_KINDS for p in split["prompts"][kind][: settings["sweep_per_kind"]]]
        sample = sample[: settings["sweep_prompts"]]
        sweep = sweep_exit_layers(model, sample, settings["exits"], K, settings["sweep_tokens"])
        best = best_exit_layer(sweep)
        results["early_exit"] = {"sweep": sweep, "best_layers": best}
        say(f"early exit sweep: best L = {best} of {sweep[0]['of_layers']}")
        if budget.fits(f"early-exit:{best}", needs_s["early-exit eval"]):
            results["evaluation"][f"early-exit:{best}"] = evaluate(
                f"early-exit:{best}", model, split, settings["tokens"], lambda: EarlyExit(model, best), say
            )
