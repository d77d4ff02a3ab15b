"""Sweeps: generations over prompts x drafters x policies x temperatures, with plain baselines.

Every prompt (at every temperature and seed) is first decoded plainly, then speculatively with
each drafter and policy, in the same process, so speedups are ratios measured in one run:
speedup = speculative decode tokens/s / plain decode tokens/s, by the clock from the first token
to the last (prefill excluded: it is the same forward pass either way). Greedy runs are checked
token for token against the plain output.

A prompt's prefix (all but its last token) is prefilled once and every generation of that prompt
starts from a copy of that cache (except for drafters that need the prompt's hidden states), so
the prompt is not prefilled again for every drafter and policy.

``Sweep.runs`` has one row per generation, ``Sweep.steps`` every step log; ``summary`` and
``per_position`` aggregate them as Spec-Bench reports (mean accepted tokens, acceptance rate,
per-position acceptance). ``losslessness_check`` compares token histograms of plain and
speculative sampling with a permutation test.
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import mlx.core as mx
import numpy as np
import polars as pl

from specbench.core.engine import GenerateOptions, generate, speculative_generate
from specbench.common.files import write_parquet_atomic
from specbench.core.policies import DraftPolicy

TINY_PREFIX = "tiny:"
SYNTHETIC_PREFIX = "synthetic:"

#: Dimensions of a miniature ("tiny:NAME"): the model's architecture and tokenizer, these sizes.
TINY_DIMS = {
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 16, "moe_intermediate_size": 32, "shared_expert_intermediate_size": 32,
}
TINY_EXPERTS = {"num_experts": 8, "num_experts_per_tok": 2, "n_routed_experts": 8}


# -- models ------------------------------------------------------------------------------------


def load_model(name: str, seed: int = 0) -> tuple[Any, Any]:
    """(model, tokenizer) by name, as notebooks take them.

    ``tiny:NAME``: a random-weight miniature of NAME (its architecture and tokenizer, 2 layers of
    width 64, float32) for checking a pipeline in seconds; ``synthetic:SHAPE``: a random model at
    a real shape (``specbench.synthetic``; no tokenizer, so None); anything else:
    ``specbench.load`` (embedded short names, local folders, Hugging Face ids).
    """
    if name.startswith(TINY_PREFIX):
        return tiny_model(name[len(TINY_PREFIX):], seed=seed)
    if name.startswith(SYNTHETIC_PREFIX):
        from specbench.models.synthetic import build

        return build(name, seed=seed), None
    from specbench.models.load import load

    model, tokenizer = load(name)
    model.specbench_name = name
    return model, tokenizer


def _model_folder(name: str) -> Path:
    from specbench.models.load import EMBEDDED_MODELS, ensure_embedded

    if name in EMBEDDED_MODELS:
        return ensure_embedded(name)
    path = Path(name).expanduser()
    if not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"tiny:{name} needs an embedded model name ({', '.join(EMBEDDED_MODELS)}) or a local mlx-lm "
            f"folder with config.json and a tokenizer; {name!r} is neither"
        )
    return path


def tiny_config(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` shrunk to ``TINY_DIMS`` (keys it has), vocabulary and architecture kept."""
    config = dict(config)
    text = dict(config.get("text_config", config))
    for key, value in TINY_DIMS.items():
        if key in text or key in ("hidden_size", "num_hidden_layers"):
            text[key] = value
    for key, value in TINY_EXPERTS.items():
        if key in text:
            text[key] = min(int(text[key]), value)
    interval = text.get("full_attention_interval")
    if interval:
        text["num_hidden_layers"] = max(int(interval), text["num_hidden_layers"])
    if "text_config" in config:
        config["text_config"] = text
        return config
    return text


def tiny_model(name: str, seed: int = 0, scale: float = 2.0) -> tuple[Any, Any]:
    """A random-weight miniature of model ``name`` with its real tokenizer (float32).

    2-D weights are scaled by ``scale``: at the default initialisation greedy decoding repeats
    one token (every draft accepted), at 3 and above it never repeats (none drafted); at 2 the
    output mixes both, so drafts are accepted in part, as with a real model.
    """
    from mlx.utils import tree_map
    from mlx_lm.utils import _get_classes, load_config, load_tokenizer

    folder = _model_folder(name)
    config = load_config(folder)
    small = tiny_config(config)
    model_class, args_class = _get_classes(small)
    mx.random.seed(seed)
    model = model_class(args_class.from_dict(small))
    model.update(tree_map(lambda p: (p * scale if p.ndim == 2 else p).astype(mx.float32), model.parameters()))
    mx.eval(model.parameters())
    model.eval()
    model.specbench_name = f"{TINY_PREFIX}{name}"
    eos = config.get("eos_token_id")
    tokenizer = load_tokenizer(folder, eos_token_ids=[eos] if isinstance(eos, int) else eos)
    return model, tokenizer


# -- prompts -----------------------------------------------------------------------------------


@dataclass
class Prompt:
    """One prompt of a sweep: its id, category, text (first turn) and token ids."""

    id: str
    category: str
    text: str
    ids: list[int]


def prompts_from(
    source: str | Path | Sequence[str],
    tokenizer: Any,
    categories: Sequence[str] | None = None,
    limit: int | None = None,
    chat: bool = True,
    max_prompt_tokens: int | None = None,
) -> list[Prompt]:
    """Prompts of a sweep: ``"bundled"``, a Spec-Bench-format ``question.jsonl``, or a list of texts.

    Each question's first turn is rendered with the chat template (``chat``). ``limit`` keeps the
    first ``limit`` of each category; ``max_prompt_tokens`` drops longer prompts (prefill is the
    slow part on a CPU).
    """
    from specbench.experiments.prompts import questions_from, render_prompt

    if tokenizer is None:
        raise ValueError("text prompts need a tokenizer: this model has none (use a model with a tokenizer)")
    if isinstance(source, (list, tuple)):
        texts = [("custom", f"p{i}", t) for i, t in enumerate(source)]
        if not texts:
            raise ValueError("the prompt list is empty")
        if limit is not None:
            texts = texts[:limit]
    else:
        texts = [(q.category, str(q.question_id), q.turns[0]) for q in questions_from(source, categories, limit)]
    prompts = [Prompt(pid, category, text, render_prompt(tokenizer, text, chat=chat)) for category, pid, text in texts]
    if max_prompt_tokens is not None:
        prompts = [p for p in prompts if len(p.ids) <= max_prompt_tokens]
        if not prompts:
            raise ValueError(f"no prompt has at most max_prompt_tokens={max_prompt_tokens} tokens: raise the limit")
    return prompts


def prompt_table(prompts: Sequence[Prompt], width: int = 60) -> pl.DataFrame:
    """A short table of prompts: id, category, tokens, the text's start."""
    return pl.DataFrame(
        {
            "id": [p.id for p in prompts],
            "category": [p.category for p in prompts],
            "tokens": [len(p.ids) for p in prompts],
            "text": [p.text[:width].replace("\n", " ") + ("..." if len(p.text) > width else "") for p in prompts],
        }
    )


# -- policies ----------------------------------------------------------------------------------


def policy_parts(policy: str) -> tuple[str, int | None]:
    """("fixed", 4) for "fixed:4"; ("auto", None) for "auto"; ("none", 0) for plain decoding."""
    name, _, arg = policy.partition(":")
    if name == "none":
        return "none", 0
    return name, int(arg) if arg.isdigit() else None


def policy_specs(families: Sequence[str], draft_lengths: Sequence[int]) -> list[str]:
    """Policy specs of a sweep: ``fixed`` and ``adaptive`` at every draft length, ``auto`` once
    (it picks its own length), e.g. (["fixed", "auto"], [1, 4]) -> fixed:1, fixed:4, auto."""
    specs = []
    for family in families:
        if family == "auto":
            specs.append("auto")
        elif family in ("fixed", "adaptive"):
            if not draft_lengths:
                raise ValueError(f"policy {family!r} needs draft lengths")
            specs += [f"{family}:{int(k)}" for k in draft_lengths]
        else:
            raise ValueError(f"unknown policy {family!r}: use fixed, adaptive or auto")
    for spec in specs:
        DraftPolicy.parse(spec)
    return specs


# -- runs --------------------------------------------------------------------------------------


def prefix_cache(model: Any, prompt_ids: Sequence[int], step: int = 2048) -> list[Any] | None:
    """A prompt cache holding all but the last token of ``prompt_ids`` (None for a 1-token
    prompt): generations of that prompt start from a copy (``cache_copy``) instead of a prefill."""
    from mlx_lm.models.cache import make_prompt_cache

    from specbench.core.forward import forward

    if len(prompt_ids) < 2:
        return None
    cache = make_prompt_cache(model)
    prefix = mx.array(list(prompt_ids[:-1]), dtype=mx.uint32)[None]
    for start in range(0, prefix.shape[1], step):
        forward(model, prefix[:, start : start + step], cache)
        mx.eval([c.state for c in cache])
    return cache


def cache_copy(cache: list[Any] | None, drafter: Any = None) -> list[Any] | None:
    """A copy of a prefix cache for one generation (None where the drafter needs the prompt's
    hidden states, which only a full prefill yields)."""
    if cache is None or (drafter is not None and getattr(drafter, "needs_hidden", False)):
        return None
    return copy.deepcopy(cache)


def timed(generation: Any) -> tuple[list[int], float]:
    """Run a Generation to the end: (its tokens, wall seconds from the first token to the last).

    The first token comes from the prompt pass, so the seconds cover decoding alone, measured
    by the clock rather than summed from the step log (some work between steps is in no step).
    """
    import time

    tokens: list[int] = []
    first = end = 0.0
    for token in generation:
        end = time.perf_counter()
        if not tokens:
            first = end
        tokens.append(token)
    return tokens, end - first


def clock_stats(generation: Any, seconds: float) -> dict[str, Any]:
    """``generation.stats()`` with ``decode_s`` and ``decode_tokens_per_s`` from ``timed``'s clock."""
    decode = len(generation.tokens) - 1
    return {**generation.stats(), "decode_s": seconds, "decode_tokens_per_s": decode / seconds if seconds > 0 else 0.0}


@dataclass
class SideBySide:
    """One prompt decoded plainly, then speculatively: both generations and their decode times."""

    plain: Any
    speculative: Any
    plain_s: float
    speculative_s: float

    @property
    def plain_tokens_per_s(self) -> float:
        return (len(self.plain.tokens) - 1) / self.plain_s if self.plain_s > 0 else float("nan")

    @property
    def speculative_tokens_per_s(self) -> float:
        return (len(self.speculative.tokens) - 1) / self.speculative_s if self.speculative_s > 0 else float("nan")

    @property
    def speedup(self) -> float:
        return self.speculative_tokens_per_s / self.plain_tokens_per_s

    def stats(self) -> dict[str, Any]:
        """The speculative generation's stats, with decode time and speed by the clock."""
        return clock_stats(self.speculative, self.speculative_s)

    @property
    def equal(self) -> bool | None:
        """Outputs equal token for token (None when sampling: not expected)."""
        if self.plain.options.temperature != 0:
            return None
        return list(self.plain.tokens) == list(self.speculative.tokens)


def side_by_side(
    model: Any, tokenizer: Any, prompt_ids: Sequence[int], options: GenerateOptions, drafter: Any, policy: Any
) -> SideBySide:
    """Decode ``prompt_ids`` plainly and then speculatively (same options), timing both."""
    plain = generate(model, prompt_ids, options, tokenizer=tokenizer)
    _, plain_s = timed(plain)
    spec = speculative_generate(model, prompt_ids, options, drafter, policy, tokenizer=tokenizer)
    _, spec_s = timed(spec)
    return SideBySide(plain, spec, plain_s, spec_s)


def _verify_mode(verify: str | None, temperature: float) -> str | None:
    """The verify mode to ask for: exact where asked (or the greedy default) and available."""
    if verify not in (None, "exact", "fast"):
        raise ValueError(f"verify must be 'exact', 'fast' or None, got {verify!r}")
    wants_exact = verify == "exact" or (verify is None and temperature == 0)
    if wants_exact:
        from specbench.experiments.capabilities import has

        if not has("exact_verify"):
            if verify == "exact":
                raise ValueError("verify='exact' needs specbench.exact, which is not installed")
            return "fast"
    return verify


@dataclass
class Sweep:
    """Results of ``run_sweep``: one row per generation, and every step."""

    runs: pl.DataFrame
    steps: pl.DataFrame
    skipped: dict[str, str] = field(default_factory=dict)

    def summary(self, by: Sequence[str] = ("drafter", "policy")) -> pl.DataFrame:
        return summarise(self.runs, by)

    def per_position(self, by: Sequence[str] = ("drafter", "policy")) -> pl.DataFrame:
        return per_position_acceptance(self.steps, by)

    def save(self, folder: str | os.PathLike, name: str = "sweep") -> list[Path]:
        """``NAME-runs.parquet`` and ``NAME-steps.parquet`` in ``folder``, written atomically."""
        folder = Path(folder)
        return [write_parquet_atomic(self.runs, folder / f"{name}-runs.parquet"),
                write_parquet_atomic(self.steps, folder / f"{name}-steps.parquet")]


def run_sweep(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[Prompt | Sequence[int]],
    drafters: Sequence[str] = ("lookup",),
    policies: Sequence[str] = ("fixed:1", "fixed:2", "fixed:4"),
    max_tokens: int = 64,
    temperatures: Sequence[float] = (0.0,),
    seeds: Sequence[int] = (0,),
    verify: str | None = None,
    model_name: str | None = None,
    ignore_eos: bool = False,
    warmup_tokens: int = 4,
    progress: bool = True,
    drafter_factories: dict[str, Callable[[], Any]] | None = None,
    reuse_prefill: bool = True,
) -> Sweep:
    """Decode every prompt plainly, then with each drafter x policy, per temperature and seed.

    Drafters are built fresh for every generation (a SuffixDecoding store does not carry over
    between runs of one prompt). Drafters the model cannot use (not installed, no MTP head) are
    left out and listed in ``Sweep.skipped``. ``drafter_factories`` adds or replaces drafters
    (name -> a function building a fresh one), e.g. a user-written drafter. ``reuse_prefill``
    starts every generation of a prompt from one prefill of its prefix.
    """
    from tqdm.auto import tqdm

    from specbench.experiments.capabilities import usable_drafters

    if not prompts:
        raise ValueError("no prompts to sweep")
    for spec in policies:
        DraftPolicy.parse(spec)
    name = model_name or getattr(model, "specbench_name", None)
    listed = [d for d in drafters if d not in (drafter_factories or {})]
    factories, skipped = usable_drafters(listed, model, name)
    factories.pop("none", None)
    factories.pop("plain", None)
    factories.update(drafter_factories or {})
    items = [p if isinstance(p, Prompt) else Prompt(f"p{i}", "custom", "", [int(t) for t in p]) for i, p in enumerate(prompts)]
    if warmup_tokens:
        list(generate(model, items[0].ids, GenerateOptions(max_tokens=warmup_tokens, ignore_eos=True)))
        if factories and any(_verify_mode(verify, t) == "exact" or (_verify_mode(verify, t) is None and t == 0)
                             for t in temperatures):
            _calibrate_exact(model, policies, factories)
    total = len(items) * len(temperatures) * len(seeds) * (1 + len(factories) * len(policies))
    bar = tqdm(total=total, desc="sweep", disable=not progress, leave=False)
    runs: list[dict[str, Any]] = []
    frames: list[pl.DataFrame] = []
    try:
        for prompt in items:
            prefix = prefix_cache(model, prompt.ids) if reuse_prefill else None
            for temperature in temperatures:
                for seed in seeds:
                    options = GenerateOptions(
                        max_tokens=max_tokens, temperature=float(temperature), seed=seed, ignore_eos=ignore_eos,
                        verify=_verify_mode(verify, temperature),
                    )
                    base = {"prompt": prompt.id, "category": prompt.category, "prompt_tokens": len(prompt.ids),
                            "temperature": float(temperature), "seed": seed}
                    bar.set_postfix_str(f"{prompt.id} plain T={temperature}")
                    plain = generate(model, prompt.ids, options, tokenizer=tokenizer, prompt_cache=cache_copy(prefix))
                    plain_tokens, plain_s = timed(plain)
                    baseline = {"plain_decode_tokens": len(plain_tokens) - 1, "plain_decode_s": plain_s}
                    runs.append(_row(len(runs), base, "none", "none", plain, plain_s, baseline, None))
                    frames.append(_steps(plain.log, len(runs) - 1, base))
                    bar.update()
                    for drafter_name, factory in factories.items():
                        for spec in policies:
                            bar.set_postfix_str(f"{prompt.id} {drafter_name} {spec} T={temperature}")
                            drafter = factory()
                            gen = speculative_generate(
                                model, prompt.ids, options, drafter, DraftPolicy.parse(spec), tokenizer=tokenizer,
                                prompt_cache=cache_copy(prefix, drafter),
                            )
                            tokens, seconds = timed(gen)
                            same = tokens == plain_tokens if temperature == 0 else None
                            runs.append(_row(len(runs), base, drafter_name, spec, gen, seconds, baseline, same))
                            frames.append(_steps(gen.log, len(runs) - 1, base))
                            bar.update()
    finally:
        bar.close()
    steps = pl.concat(frames, how="diagonal_relaxed") if frames else pl.DataFrame()
    return Sweep(pl.DataFrame(runs, infer_schema_length=None), steps, skipped)


def _calibrate_exact(model: Any, policies: Sequence[str], factories: dict[str, Callable[[], Any]]) -> None:
    """Calibrate exact verification for every width the sweep can use, before anything is timed
    (the first verification at a new width would otherwise carry the calibration)."""
    from specbench.exact.hooks import calibrate

    ks = [k for k in (policy_parts(p)[1] for p in policies) if k]
    if any(policy_parts(p)[0] == "auto" for p in policies):
        ks += [int(getattr(make(), "preferred_k", 4)) for make in factories.values()]
    if ks:
        calibrate(model, list(range(2, max(ks) + 2)))


def _row(
    run: int, base: dict, drafter: str, policy: str, gen: Any, seconds: float, baseline: dict, same: bool | None
) -> dict:
    stats = gen.stats()
    tokens = len(gen.tokens) - 1
    family, k = policy_parts(policy)
    tps = tokens / seconds if seconds > 0 else 0.0
    plain_tps = baseline["plain_decode_tokens"] / baseline["plain_decode_s"] if baseline["plain_decode_s"] > 0 else 0.0
    return {
        "run": run, **base, "drafter": drafter, "policy": policy, "policy_family": family, "k": k,
        "tokens": stats["tokens"], "decode_tokens": tokens, "decode_s": seconds, "prefill_s": stats["prefill_s"],
        "steps": stats["steps"], "verifies": stats["verifies"], "drafted": stats["drafted"],
        "accepted": stats["accepted"], "pauses": stats["pauses"], "acceptance_rate": stats["acceptance_rate"],
        "mean_accepted_tokens": stats["mean_accepted_tokens"], "tokens_per_verify": stats["tokens_per_verify"],
        "draft_s": stats["draft_s"], "verify_s": stats["verify_s"], "decode_tokens_per_s": tps,
        **baseline, "speedup": tps / plain_tps if plain_tps > 0 else float("nan"),
        "equal_to_plain": same, "finish_reason": stats["finish_reason"],
    }


def _steps(log: Any, run: int, base: dict) -> pl.DataFrame:
    df = log.to_polars()
    if "extra" in df.columns:
        df = df.drop("extra")
    return df.with_columns(
        pl.lit(run).alias("run"), pl.lit(base["prompt"]).alias("prompt"), pl.lit(base["category"]).alias("category"),
        pl.lit(base["temperature"]).alias("temperature"), pl.lit(base["seed"]).alias("seed"),
    )


# -- aggregates --------------------------------------------------------------------------------


def summarise(runs: pl.DataFrame, by: Sequence[str] = ("drafter", "policy")) -> pl.DataFrame:
    """Totals per group and the rates derived from them (ratios of sums, as Spec-Bench's #MAT).

    ``speedup`` = (sum of decode tokens / sum of decode seconds) over the group's runs divided by
    the same for their plain baselines; ``mean_k``: tokens drafted per verification.
    """
    by = list(by)
    missing = [c for c in by if c not in runs.columns]
    if missing:
        raise ValueError(f"cannot group by {missing}: the runs have columns {runs.columns}")
    out = (
        runs.group_by(by, maintain_order=True)
        .agg(
            pl.len().alias("runs"),
            pl.col("decode_tokens").sum(),
            pl.col("decode_s").sum(),
            pl.col("plain_decode_tokens").sum(),
            pl.col("plain_decode_s").sum(),
            pl.col("steps").sum(),
            pl.col("verifies").sum(),
            pl.col("drafted").sum(),
            pl.col("accepted").sum(),
            pl.col("equal_to_plain").drop_nulls().all().alias("all_equal_to_plain"),
            pl.col("equal_to_plain").drop_nulls().len().alias("checked"),
            *[pl.col(c).first() for c in ("policy_family", "k") if c in runs.columns and c not in by],
        )
        .with_columns(
            (pl.col("decode_tokens") / pl.col("decode_s")).alias("decode_tokens_per_s"),
            ((pl.col("decode_tokens") / pl.col("decode_s")) / (pl.col("plain_decode_tokens") / pl.col("plain_decode_s")))
            .alias("speedup"),
            (pl.col("decode_tokens") / pl.col("steps")).alias("mean_accepted_tokens"),
            pl.when(pl.col("verifies") > 0)
            .then((pl.col("accepted") + pl.col("verifies")) / pl.col("verifies"))
            .otherwise(None)
            .alias("tokens_per_verify"),
            pl.when(pl.col("drafted") > 0).then(pl.col("accepted") / pl.col("drafted")).otherwise(None).alias("acceptance_rate"),
            pl.when(pl.col("verifies") > 0).then(pl.col("drafted") / pl.col("verifies")).otherwise(None).alias("mean_k"),
        )
    )
    return out.with_columns(
        pl.when(pl.col("checked") > 0).then(pl.col("all_equal_to_plain")).otherwise(None).alias("all_equal_to_plain")
    )


def per_position_acceptance(steps: pl.DataFrame, by: Sequence[str] = ("drafter", "policy")) -> pl.DataFrame:
    """Acceptance rate of draft position i (1-based) given positions 1..i-1 were accepted.

    ``reached``: verifications that drafted position i and accepted every earlier one;
    ``accepted``: those that accepted position i too; ``rate`` = accepted / reached.
    """
    by = list(by)
    verifies = steps.filter(pl.col("kind") == "verify")
    if verifies.is_empty():
        return pl.DataFrame(schema={**{c: steps.schema.get(c, pl.Utf8) for c in by}, "position": pl.Int64,
                                    "reached": pl.Int64, "accepted": pl.Int64, "rate": pl.Float64})
    longest = int(verifies["k_drafted"].max())
    frames = []
    for i in range(longest):
        frames.append(
            verifies.filter((pl.col("k_drafted") > i) & (pl.col("accepted") >= i))
            .group_by(by, maintain_order=True)
            .agg(pl.len().alias("reached"), (pl.col("accepted") > i).sum().alias("accepted"))
            .with_columns(pl.lit(i + 1).alias("position"))
        )
    out = pl.concat(frames, how="vertical_relaxed")
    return out.with_columns((pl.col("accepted") / pl.col("reached")).alias("rate")).select(
        *by, "position", "reached", "accepted", "rate"
    ).sort([*by, "position"])


def best_per_group(summary: pl.DataFrame, group: Sequence[str], metric: str = "speedup") -> pl.DataFrame:
    """The row with the highest ``metric`` in each ``group`` (e.g. each drafter's best policy)."""
    return summary.sort(metric, descending=True, nulls_last=True).group_by(list(group), maintain_order=True).first()


# -- losslessness ------------------------------------------------------------------------------


@dataclass
class LosslessCheck:
    """Token histograms of plain and speculative sampling from one prompt, and their comparison.

    ``counts``: token id, text, plain and speculative counts (the ``top`` most frequent tokens,
    then one "other" row); ``p_value``: permutation test of the chi-square homogeneity statistic
    over whole samples (sequences are exchangeable when the sampler is lossless).
    """

    counts: pl.DataFrame
    statistic: float
    p_value: float
    tvd: float
    samples: int
    max_tokens: int
    drafter: str
    policy: str
    temperature: float
    acceptance_rate: float
    plain_sequences: list[list[int]]
    speculative_sequences: list[list[int]]


def _chi2(a: np.ndarray, b: np.ndarray) -> float:
    total = a + b
    keep = total > 0
    a, b, total = a[keep], b[keep], total[keep]
    na, nb = a.sum(), b.sum()
    ea, eb = total * na / (na + nb), total * nb / (na + nb)
    return float(((a - ea) ** 2 / ea).sum() + ((b - eb) ** 2 / eb).sum())


def histogram_test(
    plain: Sequence[Sequence[int]], speculative: Sequence[Sequence[int]], permutations: int = 2000, seed: int = 0
) -> tuple[float, float, float]:
    """(chi-square statistic, permutation p-value, total variation distance) of two sets of
    sampled sequences' pooled token histograms."""
    sequences = list(plain) + list(speculative)
    vocab = sorted({t for s in sequences for t in s})
    if not vocab:
        raise ValueError("no sampled tokens to compare")
    index = {t: i for i, t in enumerate(vocab)}
    matrix = np.zeros((len(sequences), len(vocab)))
    for row, seq in enumerate(sequences):
        for t in seq:
            matrix[row, index[t]] += 1
    labels = np.zeros(len(sequences), dtype=bool)
    labels[len(plain):] = True
    stat = _chi2(matrix[~labels].sum(0), matrix[labels].sum(0))
    rng = np.random.default_rng(seed)
    exceed = 0
    for _ in range(permutations):
        perm = rng.permutation(labels)
        exceed += _chi2(matrix[~perm].sum(0), matrix[perm].sum(0)) >= stat
    a, b = matrix[~labels].sum(0), matrix[labels].sum(0)
    tvd = 0.5 * float(np.abs(a / a.sum() - b / b.sum()).sum())
    return stat, (exceed + 1) / (permutations + 1), tvd


def losslessness_check(
    model: Any,
    tokenizer: Any,
    prompt_ids: Sequence[int],
    drafter: str = "lookup",
    policy: str = "fixed:4",
    temperature: float = 1.0,
    samples: int = 32,
    max_tokens: int = 8,
    seed: int = 0,
    top: int = 15,
    permutations: int = 2000,
    model_name: str | None = None,
    progress: bool = True,
) -> LosslessCheck:
    """Sample ``samples`` continuations plainly and ``samples`` speculatively (other seeds) and
    compare their token histograms. A lossless sampler gives a large p-value (uniform on [0, 1]
    over repeated checks); a biased one drives it towards 0 as samples grow."""
    from tqdm.auto import tqdm

    from specbench.experiments.capabilities import usable_drafters

    if temperature <= 0:
        raise ValueError("the losslessness check samples: give a temperature > 0")
    if samples < 2:
        raise ValueError(f"samples must be >= 2, got {samples}")
    factories, skipped = usable_drafters([drafter], model, model_name or getattr(model, "specbench_name", None))
    if drafter in skipped:
        raise ValueError(f"drafter {drafter!r} is not usable here: {skipped[drafter]}")
    plain, spec = [], []
    drafted = accepted = 0
    prefix = prefix_cache(model, prompt_ids)
    for i in tqdm(range(samples), desc="sampling", disable=not progress, leave=False):
        options = GenerateOptions(max_tokens=max_tokens, temperature=temperature, seed=seed + i, ignore_eos=True)
        plain.append(list(generate(model, prompt_ids, options, prompt_cache=cache_copy(prefix))))
        options = GenerateOptions(max_tokens=max_tokens, temperature=temperature, seed=seed + samples + i, ignore_eos=True)
        made = factories[drafter]()
        gen = speculative_generate(model, prompt_ids, options, made, DraftPolicy.parse(policy),
                                   prompt_cache=cache_copy(prefix, made))
        spec.append(list(gen))
        stats = gen.stats()
        drafted += stats["drafted"]
        accepted += stats["accepted"]
    stat, p, tvd = histogram_test(plain, spec, permutations, seed)
    counts_plain = np.bincount([t for s in plain for t in s], minlength=1)
    counts_spec = np.bincount([t for s in spec for t in s], minlength=1)
    size = max(len(counts_plain), len(counts_spec))
    counts_plain = np.pad(counts_plain, (0, size - len(counts_plain)))
    counts_spec = np.pad(counts_spec, (0, size - len(counts_spec)))
    order = np.argsort(-(counts_plain + counts_spec), kind="stable")[:top]
    order = [int(t) for t in order if counts_plain[t] + counts_spec[t] > 0]
    texts = [repr(tokenizer.decode([t]))[1:-1] if tokenizer is not None else str(t) for t in order]
    rest_plain = int(counts_plain.sum() - counts_plain[order].sum())
    rest_spec = int(counts_spec.sum() - counts_spec[order].sum())
    counts = pl.DataFrame(
        {
            "token": [*order, -1],
            "text": [*texts, "(other)"],
            "plain": [*(int(counts_plain[t]) for t in order), rest_plain],
            "speculative": [*(int(counts_spec[t]) for t in order), rest_spec],
        }
    )
    return LosslessCheck(
        counts, stat, p, tvd, samples, max_tokens, drafter, policy, temperature,
        accepted / drafted if drafted else 0.0, plain, spec,
    )


# -- agent traces ------------------------------------------------------------------------------


def load_trace_list(names: str | Sequence[str]) -> list[Any]:
    """Traces by name: ``"bundled"`` (every trace in data/traces), bundled trace names, or files
    in any format ``specbench.traces.load_traces`` imports."""
    from specbench.experiments.traces import bundled_traces, load_traces

    if isinstance(names, str):
        names = bundled_traces() if names == "bundled" else [names]
    if not names:
        raise ValueError("no traces given (and none bundled in data/traces)")
    traces = []
    for name in names:
        traces += load_traces(name)
    return traces


def trace_turns(results: Sequence[Any]) -> pl.DataFrame:
    """Per-turn rows of ``specbench.bench.bench_trace`` results, with ``drafter`` ("none" for
    plain decoding) and ``saved``: tokens emitted after the prefill minus the forward passes
    that emitted them (the passes speculation avoided); ``tokens_per_verify`` is null on turns
    without a verification."""
    if not results:
        raise ValueError("no trace results")
    turns = pl.concat([r.turns for r in results], how="diagonal_relaxed")
    return turns.with_columns(
        pl.when(pl.col("method") == "plain").then(pl.lit("none")).otherwise(pl.col("method")).alias("drafter"),
        (pl.col("decode_tokens") - pl.col("steps")).alias("saved"),
        # no verification, no tokens per verification (rather than 0)
        pl.when(pl.col("verifies") > 0).then(pl.col("tokens_per_verify")).otherwise(None).alias("tokens_per_verify"),
    )
