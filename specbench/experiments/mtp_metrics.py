"""What an MTP head is trained and judged on: the distillation loss against the frozen model, teacher-forced
acceptance over windows of text, and acceptance while speculative decoding drafts with the head."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from specbench.core.forward import logits_from_hidden, text_model
from specbench.core.options import GenerateOptions
from specbench.core.policies import DraftPolicy
from specbench.decoding import speculative_generate
from specbench.drafters.mtp import MtpDrafter
from specbench.models.mtp.head import MtpHead

# -- the loss ----------------------------------------------------------------------------------


def teacher(model: nn.Module, tokens: mx.array) -> tuple[mx.array, mx.array]:
    """The frozen model over ``tokens`` [B, L]: hidden states [B, L, H] and log-probs [B, L, V]."""
    hidden = text_model(model).model(tokens)
    logits = logits_from_hidden(model, hidden).astype(mx.float32)
    return hidden, logits - mx.logsumexp(logits, axis=-1, keepdims=True)


def head_logits(model: nn.Module, head: MtpHead, tokens: mx.array, hidden: mx.array) -> mx.array:
    """Head predictions for pairs (hidden at i, token i+1), i = 0 .. L-2: logits [B, L-1, V]."""
    lm = text_model(model)
    dtype = head.norm.weight.dtype
    embeds = lm.model.embed_tokens(tokens[:, 1:])
    _, out = head(embeds.astype(dtype), hidden[:, :-1].astype(dtype))
    # The output head runs in the model's own dtype (the head may train in float32).
    return logits_from_hidden(model, out.astype(lm.model.norm.weight.dtype)).astype(mx.float32)


def distill_loss(
    model: nn.Module, head: MtpHead, tokens: mx.array, hidden: mx.array, target_logprobs: mx.array
) -> tuple[mx.array, mx.array]:
    """Soft cross-entropy to the model's distribution at i+1, and the argmax agreement rate."""
    logits = head_logits(model, head, tokens, hidden)
    logq = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    target = target_logprobs[:, 1:]
    loss = -(mx.exp(target) * logq).sum(axis=-1).mean()
    agree = (mx.argmax(logits, axis=-1) == mx.argmax(target, axis=-1)).astype(mx.float32).mean()
    return loss, agree


# -- held-out metrics --------------------------------------------------------------------------


def evaluate_windows(model: nn.Module, head: MtpHead, batches: np.ndarray, batch_size: int = 16) -> dict[str, float]:
    """Held-out loss and first-draft acceptance (head argmax == model's greedy next-next token),
    teacher-forced over windows of text."""
    if len(batches) == 0:
        return {}
    losses, agrees, greedy_agree, greedy_n = [], [], 0.0, 0.0
    for i in range(0, len(batches), batch_size):
        tokens = mx.array(batches[i : i + batch_size])
        hidden, logprobs = teacher(model, tokens)
        logits = head_logits(model, head, tokens, hidden)
        target = logprobs[:, 1:]
        logq = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        hit = mx.argmax(logits, axis=-1) == mx.argmax(target, axis=-1)
        # Positions where token i+1 is the model's own greedy choice: what drafting sees.
        greedy_next = mx.argmax(logprobs[:, :-1], axis=-1) == tokens[:, 1:]
        losses.append(float((-(mx.exp(target) * logq).sum(axis=-1).mean()).item()))
        agrees.append(float(hit.astype(mx.float32).mean().item()))
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
    head: MtpHead | None = None,
) -> dict[str, Any]:
    """Speculative greedy decoding with the head: first-draft acceptance and acceptance length."""
    verifies, first, accepted, per_position = 0, 0, 0, np.zeros(k)
    drafted_at = np.zeros(k)
    tokens = 0
    t0 = time.perf_counter()
    for prompt in prompts:
        drafter = MtpDrafter(model, head=head)
        gen = speculative_generate(
            model,
            list(prompt),
            GenerateOptions(max_tokens=max_tokens, verify=verify, ignore_eos=False),
            drafter,
            DraftPolicy.fixed(k),
        )
        for _ in gen:
            pass
        tokens += len(gen.tokens)
        for r in gen.log:
            if r["kind"] != "verify" or r["k_drafted"] == 0:
                continue
            verifies += 1
            first += int(r["accepted"] >= 1)
            accepted += r["accepted"]
            drafted_at[: r["k_drafted"]] += 1
            per_position[: r["accepted"]] += 1
    return {
        "prompts": len(prompts),
        "tokens": tokens,
        "verifies": verifies,
        "first_draft_acceptance": first / verifies if verifies else float("nan"),
        "mean_accepted": accepted / verifies if verifies else float("nan"),
        "tokens_per_verify": (accepted + verifies) / verifies if verifies else float("nan"),
        "per_position_acceptance": [float(a / d) if d else float("nan") for a, d in zip(per_position, drafted_at)],
        "seconds": round(time.perf_counter() - t0, 2),
    }
