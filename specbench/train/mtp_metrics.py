"""What an MTP head is trained and judged on: the distillation loss against the frozen model, teacher-forced
acceptance over windows of text, and acceptance while speculative decoding drafts with the head (or another
drafter: ``sweep_exit_layers`` judges early exit at each depth)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from specbench.core.draft import Drafter
from specbench.core.forward import logits_from_hidden, text_model
from specbench.core.options import GenerateOptions
from specbench.core.policies import DraftPolicy
from specbench.decoding import speculative_generate
from specbench.drafters.early_exit import EarlyExit, exit_layer_count
from specbench.drafters.mtp import MtpHead
from specbench.models.mtp.head import MtpModule

# -- the loss ----------------------------------------------------------------------------------


def teacher(model: nn.Module, tokens: mx.array) -> tuple[mx.array, mx.array]:
    """The frozen model over ``tokens`` [B, L]: hidden states [B, L, H] and log-probs [B, L, V]."""
    hidden = text_model(model).model(tokens)
    logits = logits_from_hidden(model, hidden).astype(mx.float32)
    return hidden, logits - mx.logsumexp(logits, axis=-1, keepdims=True)


def head_logits(
    model: nn.Module, head: MtpModule, tokens: mx.array, state: mx.array, s: int = 1
) -> tuple[mx.array, mx.array]:
    """Draft position ``s`` over tokens [B, L]: the head fed ``state`` at i (the model's hidden state for s = 1) and
    token i+s, for i = 0 .. L-s-1 -> (its chained state, logits [B, L-s, V])."""
    lm = text_model(model)
    dtype = head.norm.weight.dtype
    embeds = lm.model.embed_tokens(tokens[:, s:]).astype(dtype)
    chained, out = head(embeds, state[:, : tokens.shape[1] - s].astype(dtype))
    # The output head runs in the model's own dtype (the head may train in float32).
    return chained, logits_from_hidden(model, out.astype(lm.model.norm.weight.dtype)).astype(mx.float32)


def soft_cross_entropy(logits: mx.array, target_logprobs: mx.array) -> tuple[mx.array, mx.array]:
    """Mean soft cross-entropy of ``logits`` to a target distribution, and the argmax agreement rate."""
    logq = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    loss = -(mx.exp(target_logprobs) * logq).sum(axis=-1).mean()
    agree = (mx.argmax(logits, axis=-1) == mx.argmax(target_logprobs, axis=-1)).astype(mx.float32).mean()
    return loss, agree


def chain_loss(
    model: nn.Module,
    head: MtpModule,
    tokens: mx.array,
    hidden: mx.array,
    target_logprobs: mx.array,
    depth: int = 3,
    decay: float = 0.8,
) -> tuple[mx.array, mx.array]:
    """The distillation loss of every draft position 1 .. ``depth``, the head fed its own states.

    Position 1 reads pairs (model's hidden state at i, token i+1) and predicts the model's
    distribution at i+1; position s reads (the head's chained state of position s-1 for the same i,
    token i+s) and predicts the distribution at i+s, as drafting chains the head (EAGLE, DeepSeek's
    MTP). Teacher forcing: token i+s is the data's, which on the model's own greedy outputs is the
    token an accepted draft holds. Losses are weighted ``decay`` ** (s-1), normalised; returns the
    loss and position 1's agreement rate.
    """
    state, total, weights, first_agree = hidden, 0.0, 0.0, None
    for s in range(1, min(depth, tokens.shape[1] - 1) + 1):
        state, logits = head_logits(model, head, tokens, state, s)
        loss, agree = soft_cross_entropy(logits, target_logprobs[:, s:])
        weight = decay ** (s - 1)
        total, weights = total + weight * loss, weights + weight
        first_agree = agree if first_agree is None else first_agree
    return total / weights, first_agree


# -- held-out metrics --------------------------------------------------------------------------


def evaluate_windows(model: nn.Module, head: MtpModule, batches: np.ndarray, batch_size: int = 16) -> dict[str, float]:
    """Held-out loss and first-draft acceptance (head argmax == model's greedy next-next token),
    teacher-forced over windows of text."""
    if len(batches) == 0:
        return {}
    losses, agrees, greedy_agree, greedy_n = [], [], 0.0, 0.0
    for i in range(0, len(batches), batch_size):
        tokens = mx.array(batches[i : i + batch_size])
        hidden, logprobs = teacher(model, tokens)
        _, logits = head_logits(model, head, tokens, hidden)
        loss, agree = soft_cross_entropy(logits, logprobs[:, 1:])
        hit = mx.argmax(logits, axis=-1) == mx.argmax(logprobs[:, 1:], axis=-1)
        # Positions where token i+1 is the model's own greedy choice: what drafting sees.
        greedy_next = mx.argmax(logprobs[:, :-1], axis=-1) == tokens[:, 1:]
        losses.append(float(loss.item()))
        agrees.append(float(agree.item()))
        greedy_agree += float((hit & greedy_next).sum().item())
        greedy_n += float(greedy_next.sum().item())
    return {
        "loss": float(np.mean(losses)),
        "acceptance": float(np.mean(agrees)),
        "acceptance_after_greedy_token": greedy_agree / greedy_n if greedy_n else float("nan"),
        "windows": int(len(batches)),
    }


def evaluate_decoding(
    model: nn.Module,
    prompts: Sequence[Sequence[int]],
    max_tokens: int,
    k: int,
    verify: str = "fast",
    head: MtpModule | None = None,
    drafter_factory: Callable[[], Drafter] | None = None,
) -> dict[str, Any]:
    """Speculative greedy decoding with a fixed draft of ``k``: first-draft acceptance and acceptance length.

    The drafter is ``drafter_factory()`` (one per prompt), else the model's MTP head (``head`` or the
    attached one). ``per_position_acceptance[i]``: the share of verifications drafting position i+1
    that accepted it (so it includes the earlier positions' acceptance);
    ``conditional_acceptance[i]``: the same among verifications that accepted positions 1..i.
    ``draft_seconds_per_token``: the drafter's seconds per drafted token, as the engine timed them
    (each prompt's first draft, which also reads the prompt, left out).
    """
    verifies, first, accepted, per_position = 0, 0, 0, np.zeros(k)
    drafted_at = np.zeros(k)
    tokens, drafted, draft_s = 0, 0, 0.0
    t0 = time.perf_counter()
    for prompt in prompts:
        drafter = drafter_factory() if drafter_factory is not None else MtpHead(model, head=head)
        gen = speculative_generate(
            model,
            list(prompt),
            GenerateOptions(max_tokens=max_tokens, verify=verify, ignore_eos=False),
            drafter=drafter,
            policy=DraftPolicy.fixed(k),
        )
        for _ in gen:
            pass
        tokens += len(gen.tokens)
        steady = False  # the first draft also feeds the prompt to the drafter: left out of its cost
        for r in gen.log:
            if r.kind != "verify" or r.k_drafted == 0:
                continue
            verifies += 1
            if steady:
                drafted += r.k_drafted
                draft_s += r.draft_s
            steady = True
            first += int(r.accepted >= 1)
            accepted += r.accepted
            drafted_at[: r.k_drafted] += 1
            per_position[: r.accepted] += 1
    return {
        "prompts": len(prompts),
        "tokens": tokens,
        "verifies": verifies,
        "first_draft_acceptance": first / verifies if verifies else float("nan"),
        "mean_accepted": accepted / verifies if verifies else float("nan"),
        "tokens_per_verify": (accepted + verifies) / verifies if verifies else float("nan"),
        "per_position_acceptance": [float(a / d) if d else float("nan") for a, d in zip(per_position, drafted_at)],
        "conditional_acceptance": [
            float(per_position[i] / base) if drafted_at[i] and base else float("nan")
            for i, base in enumerate([drafted_at[0], *per_position[:-1]])
        ],
        "drafted": drafted,
        "draft_seconds_per_token": draft_s / drafted if drafted else float("nan"),
        "seconds": round(time.perf_counter() - t0, 2),
    }


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
