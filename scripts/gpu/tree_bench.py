"""Token trees against paths, run for real: one timed generation, the verifiers a tree study compares (exact and
fast), and SuffixDecoding's real runs on a trace's turns set against the simulator's replay of the same turns."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from specbench.core.draft import Drafter
from specbench.core.engine import Generation, plain_generation
from specbench.core.options import GenerateOptions
from specbench.core.policies import DraftPolicy
from specbench.drafters import SuffixDecoding
from specbench.exact import ExactVerifier, verifier_for
from specbench.simulate.simulate import Recorded, simulate

#: The fields of a step that a real run and the simulator's replay must agree on.
STEP_FIELDS = ("kind", "accepted", "accepted_path", "tokens")


def timed(
    model: nn.Module,
    prompt: Sequence[int],
    options: GenerateOptions,
    verifier: Any = None,
    drafter: Drafter | None = None,
    k: int = 0,
    tokenizer: Any = None,
) -> tuple[list[int], float, dict[str, Any], Any]:
    """(tokens, seconds, log stats, the generation) of one greedy generation: plain without ``drafter``, else
    speculative at fixed ``k`` with ``verifier`` (stopping at the tokenizer's EOS when one is given)."""
    mx.synchronize()
    t0 = time.perf_counter()
    if drafter is None:
        gen = plain_generation(model, prompt, options, tokenizer=tokenizer)
    else:
        policy = DraftPolicy.fixed(k)
        gen = Generation(model, prompt, options, drafter=drafter, policy=policy, verifier=verifier, tokenizer=tokenizer)
    tokens = list(gen)
    mx.synchronize()
    return tokens, time.perf_counter() - t0, gen.log.stats(), gen


def tree_verifiers(model: nn.Module, quick: bool, widths: int) -> dict[str, Any]:
    """{"exact": ..., "fast": ...}: exact calibrated up front for widths 2..``widths`` on the device (one fixed
    exact level in a ``quick`` CPU run), and fast."""
    exact = ExactVerifier(model, level="attention") if quick else ExactVerifier(model, widths=range(2, widths + 1))
    return {"exact": exact, "fast": verifier_for(model, "fast")}


def suffix_real_row(
    model: nn.Module,
    tokenizer: Any,
    turns: Sequence[Recorded],
    verifier: Any,
    tree: bool,
    nodes: int,
    plain_s: float,
    tokens: int,
) -> dict[str, Any]:
    """SuffixDecoding (``nodes`` speculative tokens, a ``tree`` or a path) run for real on ``turns`` in order
    (``tokens`` each) and replayed by the simulator: accepted tokens and nodes per verification, seconds against
    ``plain_s``, whether every output equals the recorded one and every real step the simulator's."""
    drafter = SuffixDecoding(max_spec_tokens=nodes, tree=tree)
    replayed = SuffixDecoding(max_spec_tokens=nodes, tree=tree)
    options = GenerateOptions(max_tokens=tokens)
    spec_s, identical, agree, verifies, accepted, drafted = 0.0, True, True, 0, 0, 0
    for turn in turns:
        out, seconds, stats, gen = timed(model, turn.prompt, options, verifier, drafter, nodes, tokenizer)
        log = simulate([turn], replayed, DraftPolicy.fixed(nodes), options)
        agree &= [[getattr(r, k) for k in STEP_FIELDS] for r in log] == [
            [getattr(r, k) for k in STEP_FIELDS] for r in gen.log
        ]
        spec_s += seconds
        identical &= out == turn.output
        verifies += stats["verifies"]
        accepted += stats["accepted"]
        drafted += sum(r.k_drafted for r in gen.log.records if r.kind == "verify")
    return {
        "draft": "tree" if tree else "path",
        "turns": len(turns),
        "accepted_per_verify": round(accepted / verifies, 3) if verifies else 0.0,
        "nodes_per_verify": round(drafted / verifies, 3) if verifies else 0.0,
        "plain_s": round(plain_s, 3),
        "seconds": round(spec_s, 3),
        "speedup": round(plain_s / spec_s, 3) if spec_s else 0.0,
        "identical": identical,
        "simulator_agrees": agree,
    }
