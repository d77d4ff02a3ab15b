"""Run by ``mlx.launch -n 2 --backend ring`` (tests/distributed/test_lockstep.py): every rank builds the
same tiny qwen3 and qwen3_moe models, shards them over the group and decodes plainly and speculatively;
each rank writes what it produced to OUT/rank<R>.json."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

OUT = Path(sys.argv[1])
RANK = int(os.environ.get("MLX_RANK", "0"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402
from conftest import build_tiny, plain_greedy  # noqa: E402

os.environ["SPECBENCH_HOME"] = str(OUT / f"home{RANK}")  # (after conftest, which sets its own) rank 0 alone writes

from specbench import DraftPolicy, GenerateOptions, generate, speculative_generate  # noqa: E402
from specbench.bench.sweep import run_sweep  # noqa: E402
from specbench.common import distributed  # noqa: E402
from specbench.core.draft import Draft, Drafter  # noqa: E402
from specbench.drafters import PromptLookup  # noqa: E402
from specbench.exact.calibration import load_calibration  # noqa: E402
from specbench.models.load import shard_model  # noqa: E402

(OUT / f"started{RANK}").write_text("")

if RANK == 1:
    # This rank's clock and probes disagree with rank 0's: it finds the batched forward inexact and sees every
    # level's cost in reverse. Calibration must still take one decision on all ranks (or their collectives never
    # meet), whatever the BLAS: rank 1 alone would test more levels and pick others.
    from specbench.exact import calibration

    measured = calibration._Probe.run

    def skewed(self, level, width):
        exact, seconds = measured(self, level, width)
        return exact and level != "none", 1.0 / (1e-9 + seconds)

    calibration._Probe.run = skewed


class RankNoisyDrafter(Drafter):
    """Proposes the known greedy continuation, wrong at positions drawn from a generator seeded by
    the rank (and, when sampling, with a q drawn the same way): without rank 0's drafts broadcast,
    the ranks would verify different drafts."""

    name = "noisy"

    def __init__(self, truth: list[int], prompt_len: int, vocab: int, with_q: bool = False):
        self.truth, self.prompt_len, self.vocab, self.with_q = truth, prompt_len, vocab, with_q
        self.rng = np.random.default_rng(1000 + distributed.rank())

    def draft(self, context, k):
        done = len(context) - self.prompt_len
        tokens = (self.truth[done : done + k] + [1] * k)[:k]
        tokens = [(t + 1) % self.vocab if self.rng.random() < 0.3 else t for t in tokens]
        if not self.with_q:
            return Draft(tokens)
        q = mx.softmax(mx.array(self.rng.normal(size=(k, self.vocab)).astype(np.float32)), axis=-1)
        return Draft(tokens, q)


def run(gen) -> dict:
    tokens = list(gen)
    stats = gen.stats()
    return {"tokens": tokens, "verifies": stats["verifies"], "accepted": stats["accepted"], "drafted": stats["drafted"]}


results = {"rank": RANK, "size": distributed.size(), "backend": distributed.backend()}
prompt = [5, 9, 13, 5, 9, 13, 5, 9, 21, 33, 40, 7]
n = 16
for arch in ("qwen3", "qwen3_moe"):
    model = build_tiny(arch, seed=3)
    shard_model(model, f"tiny {arch}")
    vocab = 97
    plain = list(generate(model, prompt, GenerateOptions(max_tokens=n)))
    out = {"plain": plain, "mlx_lm": plain_greedy(model, prompt, n), "sharded": list(model.specbench_group)}
    for mode, policy in (("exact", "fixed:3"), ("fast", "adaptive:4")):
        drafter = RankNoisyDrafter(plain, len(prompt), vocab)
        options = GenerateOptions(max_tokens=n, verify=mode)
        out[f"noisy-{mode}"] = run(
            speculative_generate(model, prompt, options, drafter=drafter, policy=DraftPolicy.parse(policy))
        )
    if arch == "qwen3":  # Auto plans with a profile all ranks measure together
        options = GenerateOptions(max_tokens=n, verify="fast")
        out["lookup-auto"] = run(
            speculative_generate(model, prompt, options, drafter=PromptLookup(), policy=DraftPolicy.auto())
        )
    sampled = GenerateOptions(max_tokens=n, temperature=0.8, seed=7, verify="fast")
    drafter = RankNoisyDrafter(plain, len(prompt), vocab, with_q=True)
    out["sampled"] = run(speculative_generate(model, prompt, sampled, drafter=drafter, policy=DraftPolicy.fixed(3)))
    out["calibration"] = {w: c.level for w, c in sorted(load_calibration(model).widths.items())}
    results[arch] = out
    if arch == "qwen3":  # a sweep of a sharded model: every cell on all ranks, rank 0's cells written
        swept = run_sweep(model, None, [prompt], ("lookup",), ("fixed:2",), max_tokens=8, verify="fast", progress=False)
        results["sweep"] = swept.runs.select("drafter", "policy", "decode_tokens", "accepted").to_dicts()
(OUT / f"rank{RANK}.json").write_text(json.dumps(results))
