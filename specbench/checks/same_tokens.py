"""Does speculative sampling give plain sampling's tokens? With one seed per run, sampled plainly and speculatively,
each position's token drawn by position (``GenerateOptions.sample_by_position``): the runs whose tokens are the same.

Where the rule can (``specbench.core.rules``: "exact-match" always, "token" and "block" with deterministic drafts)
and the verification's logits are plain decoding's (exact verification, the default when sampling by position),
every run is the same; a run that is not says where it first differs. Without sampling by position (one random
stream per run) the same seed gives different tokens as soon as a verification draws differently from plain steps.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tqdm import tqdm  # text bars: a notebook run by `specbench report` shows them on the console

from specbench.bench.turn_cache import first_divergence
from specbench.checks.lossless import Sampler
from specbench.core.options import GenerateOptions
from specbench.core.policies import DraftPolicy, as_policy
from specbench.core.rules import AcceptanceRule, rule_for
from specbench.core.verify import VerifyMode
from specbench.decoding import generate

if TYPE_CHECKING:
    import polars as pl


@dataclass
class SameTokensCheck:
    """Plain and speculative sampling with one seed per run, compared token for token.

    ``seeds``: each run's seed; ``first_difference``: per run, the index of the first token where the two differ
    (None: the same tokens); ``plain`` / ``speculative``: each run's tokens; ``accepted_drafts`` / ``drafted``: draft
    tokens accepted / proposed over the speculative runs (a check whose drafts were never accepted says little);
    ``acceptance``: the rule's label; ``sample_by_position``: whether each draw was keyed by position."""

    seeds: list[int]
    first_difference: list[int | None]
    plain: list[list[int]]
    speculative: list[list[int]]
    drafter: str
    policy: str
    acceptance: str
    temperature: float
    max_tokens: int
    sample_by_position: bool
    verify: VerifyMode
    accepted_drafts: int = 0
    drafted: int = 0

    @property
    def runs(self) -> int:
        return len(self.seeds)

    @property
    def same(self) -> int:
        """Runs whose speculative tokens are plain sampling's."""
        return sum(d is None for d in self.first_difference)

    def describe(self) -> str:
        """The count of identical runs, with what was compared and how much the drafts were used."""
        keyed = "each draw keyed by (seed, position)" if self.sample_by_position else "one random stream per run"
        return (
            f"same tokens on {self.same} of {self.runs} runs ({self.same / self.runs:.0%}): {self.max_tokens} tokens "
            f"at temperature {self.temperature:g}, {keyed}, {self.verify} verification; drafter {self.drafter}, "
            f"policy {self.policy}, acceptance {self.acceptance}; {self.accepted_drafts} of {self.drafted} drafted "
            "tokens accepted"
        )

    def frame(self) -> pl.DataFrame:
        """One row per run: its seed, whether the tokens are the same, where they first differ."""
        import polars as pl  # a table for the notebook: the check itself runs where polars is not installed

        return pl.DataFrame(
            {
                "seed": self.seeds,
                "same": [d is None for d in self.first_difference],
                "first_difference": self.first_difference,
            },
            schema={"seed": pl.Int64, "same": pl.Boolean, "first_difference": pl.Int64},
        )


def same_tokens_check(
    model: Any,
    prompt_ids: Sequence[int],
    drafter: str = "lookup",
    policy: DraftPolicy | str | int = 4,
    temperature: float = 1.0,
    runs: int = 20,
    max_tokens: int = 16,
    seed: int = 0,
    rule: AcceptanceRule | str = "token",
    verify: VerifyMode | None = None,
    sample_by_position: bool = True,
    model_name: str | None = None,
    progress: bool = True,
) -> SameTokensCheck:
    """Sample ``runs`` continuations of ``prompt_ids`` plainly and speculatively (``drafter``, ``policy``,
    ``rule``), run i with seed ``seed + i`` for both, and compare them token for token. ``verify``: the
    speculative runs' verify mode (default: exact when sampling by position); ``sample_by_position`` False shows
    what one random stream per run gives instead. A rule that cannot give plain sampling's tokens by position is one
    clear error before any model work."""
    policy = as_policy(policy)
    if not temperature > 0:
        raise ValueError("the same-tokens check samples: give a temperature > 0 (greedy output is compared elsewhere)")
    if runs < 1:
        raise ValueError(f"runs must be >= 1, got {runs}")
    rule = rule_for(rule)
    base = GenerateOptions(
        max_tokens=max_tokens,
        temperature=temperature,
        seed=seed,
        ignore_eos=True,
        acceptance_rule=rule,
        sample_by_position=sample_by_position,
        verify=verify,
    )
    base.check()
    sampler = Sampler(model, prompt_ids, drafter, model_name)
    seeds = [seed + i for i in range(runs)]
    plain: list[list[int]] = []
    spec: list[list[int]] = []
    quiet = {} if progress else {"progress": None}  # exact mode's calibration, reported unless quiet
    for run_seed in tqdm(seeds, desc="same tokens", disable=not progress, leave=False):
        options = GenerateOptions(**{**base.__dict__, "seed": run_seed})
        plain.append(sampler.plain(options, generate))
        spec.append(sampler.speculative(options, policy, **quiet))
    return SameTokensCheck(
        seeds,
        [first_divergence(a, b) for a, b in zip(plain, spec)],
        plain,
        spec,
        drafter,
        policy.name,
        rule.label,
        temperature,
        max_tokens,
        sample_by_position,
        base.verify_mode,
        accepted_drafts=sampler.accepted,
        drafted=sampler.drafted,
    )
