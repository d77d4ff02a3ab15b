"""Training an MTP head for a frozen model by self-distillation: the head learns the model's own distribution at
each draft position, fed its own chained states (``chain_loss``), on offline data and the model's own greedy
generations (``specbench.train.mtp_data``); held-out slices of each source and the project's bundled prompts,
which training never sees, judge it: teacher-forced acceptance over windows of text, and acceptance while
speculative decoding drafts with the head (or another drafter: ``scripts.gpu.drafter_eval.sweep_exit_layers``
judges early exit at each depth). ``fit`` is the loop, also used to distill draft models
(``scripts.gpu.draft_training``).
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_flatten, tree_map

from specbench.common.files import write_json_atomic
from specbench.core.draft import Drafter
from specbench.core.forward import logits_from_hidden, text_model
from specbench.core.options import GenerateOptions
from specbench.core.policies import DraftPolicy
from specbench.decoding import speculative_generate
from specbench.drafters.mtp import MtpHead
from specbench.inputs.prompts import bundled_questions, render_prompt
from specbench.models.load import cast_dtype
from specbench.models.mtp.attach import save_head
from specbench.models.mtp.head import MtpModule, body_layers, build_head, model_type
from specbench.models.synthetic import as_dtype
from specbench.train.mtp_data import (
    WindowSampler,
    batched_greedy,
    chat_prompts,
    encode_batch,
    eos_id,
    gather_text,
    stdlib_module_docs,
    stream,
    windows,
)


@dataclass
class TrainConfig:
    """Recipe of a training run (defaults: the GPU run; ``TrainConfig.quick()``: a CPU smoke run)."""

    steps: int = 4000
    time_budget_s: float | None = None  # training stops at this many seconds (the schedule follows time)
    batch_size: int = 32
    seq_len: int = 256
    learning_rate: float = 1e-3
    min_learning_rate: float = 5e-5
    warmup_steps: int = 100
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    text_chars: int = 12_000_000  # natural text + code read from the installed Python
    chat_prompts: int = 4096  # chat prompts answered by the model (greedy)
    chat_tokens: int = 192
    continuation_prompts: int = 2048  # code / text snippets continued by the model (greedy)
    continuation_prompt_tokens: int = 48
    continuation_tokens: int = 128
    generation_batch: int = 512
    generation_budget_s: float | None = None  # self-generation stops after this many seconds
    chat_share: float = 0.6  # share of the generation budget spent on chat answers (continuations: the rest)
    # Streams: "chat" (the model's answers to chat prompts), "continued" (its continuations of snippets),
    # offline "code" and "natural" text.
    mix: dict[str, float] = field(
        default_factory=lambda: {"chat": 0.3, "continued": 0.2, "code": 0.25, "natural": 0.25}
    )
    eval_windows: int = 64  # held-out windows per source for the teacher-forced evaluation
    eval_prompts: int = 24  # held-out prompts per set for the decoding evaluation
    eval_tokens: int = 96
    eval_k: int = 3
    init: str = "last_layer"  # see init_head
    depth: int = 3  # draft positions trained (the head fed its own states past the first)
    depth_decay: float = 0.8  # loss weight of position s: depth_decay ** (s - 1)
    save_dtype: str = "bfloat16"
    seed: int = 0

    @classmethod
    def gpu(cls, **overrides: Any) -> TrainConfig:
        """A run sized for one H200 (stopped by its time budget, not by ``steps``), with ``overrides``."""
        return cls(**{"steps": 1_000_000, "batch_size": 64, "chat_prompts": 8192, **overrides})

    @classmethod
    def quick(cls) -> TrainConfig:
        return cls(
            steps=30,
            batch_size=4,
            seq_len=64,
            warmup_steps=5,
            text_chars=200_000,
            chat_prompts=8,
            chat_tokens=24,
            continuation_prompts=8,
            continuation_prompt_tokens=16,
            continuation_tokens=24,
            generation_batch=8,
            eval_windows=4,
            eval_prompts=2,
            eval_tokens=16,
        )


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
        list(gen)  # run to the end
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


# -- training ----------------------------------------------------------------------------------


def init_head(model: nn.Module, how: str = "last_layer", seed: int = 0) -> MtpModule:
    """A fresh head to train.

    ``last_layer`` (the default, which learned fastest in a comparison on the embedded model):
    the decoder layer starts as a copy of the body's last layer, ``fc`` passes the hidden half
    through, and ``norm`` starts as the model's final norm. ``random``: as built.
    """
    mx.random.seed(seed)
    head = build_head(model)
    if how == "last_layer":
        last = body_layers(model)[-1]
        if any(k.endswith(".scales") for k, _ in tree_flatten(last.parameters())):
            raise ValueError("initialising from the last layer needs a float model (this one is quantized)")
        head.layers[0].update(tree_map(lambda v: mx.array(v), last.parameters()))
        hidden = head.fc.weight.shape[0]
        fc = head.fc.weight
        head.fc.weight = mx.concatenate([fc[:, :hidden] * 0.5, mx.eye(hidden, dtype=fc.dtype)], axis=1)
        head.norm.weight = mx.array(text_model(model).model.norm.weight).astype(head.norm.weight.dtype)
    elif how != "random":
        raise ValueError(f"init must be 'last_layer' or 'random', got {how!r}")
    return head


def train_head(
    model: nn.Module,
    sampler: WindowSampler,
    config: TrainConfig,
    log: Callable[[str], None] = print,
) -> tuple[MtpModule, dict[str, Any]]:
    """Train a head on windows from ``sampler`` (every draft position up to ``config.depth``, the head
    fed its own states); returns the head (float32) and a training record.

    The head's weights and optimizer state stay in float32; the frozen model runs in its own dtype.
    """
    head = init_head(model, config.init, config.seed)
    cast_dtype(head, mx.float32)

    def loss(tokens: mx.array, hidden: mx.array, target: mx.array) -> tuple[mx.array, mx.array]:
        return chain_loss(model, head, tokens, hidden, target, config.depth, config.depth_decay)

    record = fit(model, head, loss, sampler, config, log)
    return head, record


def fit(
    model: nn.Module,
    module: nn.Module,
    loss: Callable[[mx.array, mx.array, mx.array], tuple[mx.array, mx.array]],
    sampler: WindowSampler,
    config: TrainConfig,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """The training loop: AdamW on ``module``'s trainable parameters, ``loss(tokens, hidden, target)``
    (target: the frozen ``model``'s log-probabilities over the window) returning (loss, agreement);
    warm-up then a cosine schedule that follows ``config.steps`` or ``config.time_budget_s``.
    Returns the training record; ``module`` is left in eval mode."""
    module.train()
    optimizer = optim.AdamW(learning_rate=config.learning_rate, weight_decay=config.weight_decay)
    loss_and_grad = nn.value_and_grad(module, loss)

    def update(tokens: mx.array, hidden: mx.array, target: mx.array) -> tuple[mx.array, mx.array]:
        (value, agree), grads = loss_and_grad(tokens, hidden, target)
        if config.grad_clip:
            grads, _ = optim.clip_grad_norm(grads, config.grad_clip)
        optimizer.update(module, grads)
        return value, agree

    def lr_at(progress: float, step: int) -> float:
        if step < config.warmup_steps:
            return config.learning_rate * (step + 1) / config.warmup_steps
        cos = 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
        return config.min_learning_rate + (config.learning_rate - config.min_learning_rate) * cos

    history = []
    start = time.perf_counter()
    step = 0
    first_step_s = None
    while step < config.steps:
        elapsed = time.perf_counter() - start
        progress = step / config.steps
        if config.time_budget_s:
            if elapsed >= config.time_budget_s:
                break
            progress = max(progress, elapsed / config.time_budget_s)
        optimizer.learning_rate = lr_at(progress, step)
        tokens = mx.array(sampler.batch(config.batch_size))
        hidden, target = teacher(model, tokens)
        hidden, target = mx.stop_gradient(hidden), mx.stop_gradient(target)
        value, agree = update(tokens, hidden, target)
        mx.eval(module.parameters(), optimizer.state, value, agree)
        step += 1
        if first_step_s is None:
            first_step_s = time.perf_counter() - start
        if step % max(1, min(100, config.steps // 30)) == 0 or step <= 3 or step == config.steps:
            row = {
                "step": step,
                "seconds": round(time.perf_counter() - start, 2),
                "loss": float(value.item()),
                "acceptance": float(agree.item()),
                "lr": float(optimizer.learning_rate),
            }
            history.append(row)
            log(f"step {step:5d}  {row['seconds']:7.1f}s  loss {row['loss']:.4f}  acceptance {row['acceptance']:.3f}")
    module.eval()
    seconds = time.perf_counter() - start
    return {
        "steps": step,
        "seconds": round(seconds, 1),
        "first_step_s": round(first_step_s or 0.0, 2),
        "step_ms": round(1000 * (seconds - (first_step_s or 0)) / max(step - 1, 1), 2),
        "tokens_seen": step * config.batch_size * config.seq_len,
        "history": history,
    }


def build_data(
    model: nn.Module, tokenizer: Any, config: TrainConfig, log: Callable[[str], None] = print
) -> tuple[dict[str, np.ndarray], dict[str, Any], dict[str, Any]]:
    """Token streams for training and held-out sets for evaluation."""
    t0 = time.perf_counter()
    eos = eos_id(tokenizer)
    text = gather_text(config.text_chars, config.seed)
    streams: dict[str, np.ndarray] = {}
    heldout: dict[str, Any] = {}
    for kind in ("code", "natural"):
        streams[kind] = stream(encode_batch(tokenizer, text[kind]["train"]), eos)
        heldout[kind] = stream(encode_batch(tokenizer, text[kind]["heldout"]), eos)
    log(
        f"text: code {len(streams['code'])} tokens, natural {len(streams['natural'])} tokens "
        f"({time.perf_counter() - t0:.1f}s)"
    )

    rng = random.Random(config.seed)
    train_docs = stdlib_module_docs(heldout=False)
    passages = text["natural"]["train"][: config.chat_prompts // 4]
    chats = [render_prompt(tokenizer, p) for p in chat_prompts(config.chat_prompts, train_docs, config.seed, passages)]
    snippets = []
    length = config.continuation_prompt_tokens
    # Code snippets make half the continuations, document text a quarter, and the model's own answers
    # (their prose, without the chat template) the rest, once they are generated.
    for kind, n in (("code", config.continuation_prompts // 2), ("natural", config.continuation_prompts // 4)):
        s = streams[kind]
        for _ in range(n):
            if len(s) <= length + 1:
                break
            a = rng.randrange(0, len(s) - length)
            snippets.append(s[a : a + length].tolist())
    t1 = time.perf_counter()
    budget = config.generation_budget_s
    # Chat answers may use ``chat_share`` of the generation budget, continuations the rest.
    chats_until, until = (t1 + config.chat_share * budget, t1 + budget) if budget else (None, None)
    answers = batched_greedy(model, tokenizer, chats, config.chat_tokens, config.generation_batch, chats_until)
    prose = [a[len(c) : len(c) + length] for c, a in zip(chats, answers) if len(a) >= len(c) + length + 8]
    snippets += prose[: max(0, config.continuation_prompts - len(snippets))]
    rng.shuffle(snippets)
    continued = batched_greedy(
        model, tokenizer, snippets, config.continuation_tokens, config.generation_batch, until, stop_at_eos=False
    )
    streams["chat"], streams["continued"] = stream(answers, eos), stream(continued, eos)
    generated = answers + continued
    log(
        f"generated: {len(answers)} chat answers ({len(streams['chat'])} tokens), {len(continued)} continuations "
        f"({len(streams['continued'])} tokens) ({time.perf_counter() - t1:.1f}s)"
    )

    # Held-out prompts: the project's bundled prompts (chat), and snippets of held-out code and text.
    questions = bundled_questions()
    rng.shuffle(questions)
    heldout["chat_prompts"] = [render_prompt(tokenizer, q.turns[0]) for q in questions[: config.eval_prompts]]
    for kind in ("code", "natural"):
        s = heldout[kind]
        starts = np.linspace(0, max(len(s) - length - 1, 0), num=config.eval_prompts).astype(int)
        heldout[f"{kind}_prompts"] = [s[a : a + length].tolist() for a in starts if len(s) > a]
    heldout_chats = [
        render_prompt(tokenizer, p)
        for p in chat_prompts(config.eval_windows, stdlib_module_docs(True) or train_docs, config.seed + 1)
    ]
    heldout["generated"] = stream(
        batched_greedy(model, tokenizer, heldout_chats, config.chat_tokens, config.generation_batch), eos
    )
    sizes = {k: int(len(v)) for k, v in streams.items()}
    sizes.update({f"heldout_{k}": int(len(heldout[k])) for k in ("code", "natural", "generated")})
    info = {"tokens": sizes, "generated_sequences": len(generated), "seconds": round(time.perf_counter() - t0, 1)}
    return streams, heldout, info


def evaluate(
    model: nn.Module,
    head: MtpModule,
    heldout: dict[str, Any],
    config: TrainConfig,
    decoding: bool = True,
    verify: str = "fast",
) -> dict[str, Any]:
    metrics: dict[str, Any] = {"teacher_forced": {}, "decoding": {}}
    for kind in ("natural", "code", "generated"):
        w = windows(heldout[kind], config.seq_len, config.eval_windows)
        metrics["teacher_forced"][kind] = evaluate_windows(model, head, w)
    if decoding:
        for kind in ("chat", "natural", "code"):
            prompts = heldout.get(f"{kind}_prompts") or []
            if prompts:
                metrics["decoding"][kind] = evaluate_decoding(
                    model, prompts, config.eval_tokens, config.eval_k, verify, head
                )
    return metrics


def train_mtp(
    model: nn.Module,
    tokenizer: Any,
    out_dir: str | Path,
    config: TrainConfig | None = None,
    model_name: str | None = None,
    log: Callable[[str], None] = print,
    file_stem: str = "mtp",
    deadline: float | None = None,
    eval_reserve_s: float = 0.0,
) -> dict[str, Any]:
    """Build data, train a head for the frozen ``model``, evaluate it and write
    ``<out_dir>/<file_stem>.safetensors`` (the head) and ``<file_stem>.json`` (recipe and metrics).

    With a ``deadline`` (a ``time.perf_counter()`` value) training gets the time left before it,
    less ``eval_reserve_s`` for the evaluation.
    """
    config = config or TrainConfig()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    streams, heldout, data_info = build_data(model, tokenizer, config, log)
    sampler = WindowSampler(streams, config.mix, config.seq_len, config.seed)
    before = evaluate(model, init_head(model, config.init, config.seed), heldout, config, decoding=False)
    if deadline is not None:
        left = deadline - time.perf_counter() - eval_reserve_s
        config.time_budget_s = max(10.0, min(left, config.time_budget_s or left))
        log(f"training budget: {config.time_budget_s:.0f}s")
    head, record = train_head(model, sampler, config, log)
    cast_dtype(head, as_dtype(config.save_dtype))
    args = text_model(model).args
    model_config = {k: getattr(args, k) for k in ("model_type", "hidden_size", "num_hidden_layers", "vocab_size")}
    model_config["model_type"] = model_type(model)
    result = {
        "model": model_name or model_config["model_type"],
        "recipe": {
            **asdict(config),
            "objective": "soft cross-entropy to the frozen model's distribution at i+s for draft positions "
            "s = 1..depth, the head fed its own chained states",
            "device": str(mx.default_device()),
            "mlx": mx.__version__,
        },
        "data": data_info,
        "training": record,
        "metrics": {"teacher_forced_at_init": before["teacher_forced"]},
    }
    # The head is written before evaluation, so an evaluation failure loses no training.
    path = save_head(head, out_dir / f"{file_stem}.safetensors", model_config, {"model": str(model_name or "")})
    result["head"] = path.name
    result["head_parameters"] = int(sum(v.size for _, v in tree_flatten(head.parameters())))
    json_path = out_dir / f"{file_stem}.json"
    write_json_atomic(json_path, result)
    try:
        result["metrics"].update(evaluate(model, head, heldout, config))
    except Exception as err:  # keep the trained head and report what failed
        result["metrics"]["error"] = f"{type(err).__name__}: {err}"
        log(f"evaluation failed: {result['metrics']['error']}")
    result["seconds_total"] = round(time.perf_counter() - t0, 1)
    write_json_atomic(json_path, result)
    return result


def summary_lines(result: dict[str, Any]) -> list[str]:
    """A compact table of a training result."""
    lines = [
        f"model {result['model']}: {result['training']['steps']} steps in {result['training']['seconds']}s "
        f"({result['training']['step_ms']} ms/step), {result['training']['tokens_seen']} tokens seen"
    ]
    if "error" in result["metrics"]:
        lines.append(f"evaluation failed: {result['metrics']['error']}")
    lines.append(f"{'held-out set':24s} {'loss':>8s} {'accept':>8s} {'after-greedy':>12s} {'init accept':>11s}")
    for kind, m in result["metrics"].get("teacher_forced", {}).items():
        if m:
            init = result["metrics"].get("teacher_forced_at_init", {}).get(kind, {}).get("acceptance", float("nan"))
            lines.append(
                f"{'teacher-forced ' + kind:24s} {m['loss']:8.3f} {m['acceptance']:8.3f} "
                f"{m['acceptance_after_greedy_token']:12.3f} {init:11.3f}"
            )
    lines.append(f"{'decoding (greedy)':24s} {'first':>8s} {'mean acc':>8s} {'tok/verify':>12s} {'per position':>11s}")
    for kind, m in result["metrics"].get("decoding", {}).items():
        pos = " ".join(f"{p:.2f}" for p in m["per_position_acceptance"])
        lines.append(
            f"{'decode ' + kind:24s} {m['first_draft_acceptance']:8.3f} {m['mean_accepted']:8.3f} "
            f"{m['tokens_per_verify']:12.3f} {pos}"
        )
    return lines
