"""Acceptance rules when sampling (temperature > 0), one name each, chosen by ``GenerateOptions.acceptance_rule``
(a name, or an ``AcceptanceRule`` object carrying its parameters, such as ``Typical(epsilon=0.05)``).

The rules are registered (``RULES``, ``register_rule``): every module of this package is imported before the registry
is first read, so a new rule is one module here defining an ``AcceptanceRule`` subclass (docs/extending.md); the
command line's ``--acceptance-rule`` choices, the rule comparison and the checks read the registry. Each rule's
class says what it does and whether it is lossless; "token" (``specbench.core.accept``) is the default.

Sampling by position (``GenerateOptions.sample_by_position``; ``specbench.core.accept.draw_by_position``): the
target's token at each output position is drawn with a key of (seed, position), in plain decoding and in
verification alike. Plain sampling's token at a position is then a function of the key and p alone, so a rule can
yield plain sampling's tokens only if it accepts a drafted token x exactly when x is that draw y. Given the draft,
the key is independent of it, so the rule's chance of accepting x must be P(y = x) = p(x). Per rule:

- ``"exact-match"``: always (any drafter, paths, trees, batches): it accepts x iff x = y by definition.
- ``"token"``: with deterministic drafts (q one-hot, ``Draft.probs`` None) only. There min(1, p(x)/q(x)) = p(x),
  and the residual normalize(max(0, p - q)) is p without x, the law of y given y != x: accepting iff x = y and
  emitting y is the rule itself, coupled to the draw (SpecInfer's recursion over siblings likewise). With drafts
  sampled from q it accepts x with probability min(1, p(x)/q(x)) > p(x) wherever 0 < p(x) < 1 and q(x) < 1,
  so it keeps tokens plain sampling with this key would not draw: refused.
- ``"block"``: with deterministic drafts only (paths). There the prefix weights are w_i = prod_j p_j(d_j), the
  chance that the draws equal the draft's first i tokens, and the residual after a prefix is p without the next
  draft token, so accepting the longest prefix equal to the draws is the block rule coupled to them. With q,
  w_i can exceed that product (the rule accepts more than the draws allow): refused.
- ``"typical"``: never. It accepts x whenever p(x) passes its threshold, whatever the draw (its output is not
  even distributed as plain sampling's): refused.

Every rule's greedy limit (temperature 0) is the greedy rule. Each returns, besides what it accepted and
emitted, one acceptance probability per draft position (the log's ``accept_probs``): min(1, p/q) for
``"token"``, p(x) for ``"exact-match"``, the prefix weight p_i for ``"block"`` (the probability that the
first i tokens are accepted given them, averaged over the draft tokens after them), and 1 or 0 (above the
threshold or not) for ``"typical"``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

import mlx.core as mx
import numpy as np

from specbench.common.registry import Registry
from specbench.core.accept import accept_sampled, accept_tree_sampled, check_draws, check_tables, inverse_cdf
from specbench.core.policy_args import real
from specbench.core.tree import children, is_path
from specbench.core.verify import accept_tree_greedy

#: Medusa's defaults: the posterior threshold epsilon and delta (Medusa's posterior_alpha, sqrt(epsilon)).
TYPICAL_EPSILON = 0.09
TYPICAL_DELTA = 0.3
#: What a rule gives when sampling by position (``AcceptanceRule.by_position``): plain sampling's tokens with any
#: drafts, with deterministic drafts only (q one-hot), or never.
BY_POSITION = ("any drafts", "deterministic drafts", "never")
#: A rule's decision: (accepted count or accepted nodes, emitted tokens, one acceptance probability per position).
PathResult = tuple[int, list[int], list[float]]
TreeResult = tuple[list[int], list[int], list[float]]


@dataclass(frozen=True)
class AcceptanceRule:
    """An acceptance rule with its parameters (a subclass's dataclass fields), registered by ``name``.

    A subclass sets ``name``, ``description`` (one line, for help and docs), ``lossless`` (whether its tokens are
    distributed as plain sampling's), ``by_position`` (of ``BY_POSITION``) and ``paths_only``, and implements
    ``accept_path`` (and ``accept_tree`` unless ``paths_only``); ``register_rule`` makes it a choice everywhere.
    The engine calls ``path`` and ``tree``, which check the rule applies first."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    lossless: ClassVar[bool] = True
    by_position: ClassVar[str] = "deterministic drafts"
    paths_only: ClassVar[bool] = False

    @property
    def label(self) -> str:
        """The rule's name as tables and figures show it: a lossy rule says so."""
        return self.name if self.lossless else f"{self.name} (lossy)"

    @property
    def key(self) -> tuple[Any, ...]:
        """What makes two rules the same: the name and the parameters' values."""
        return (self.name, *dataclasses.astuple(self))

    def check_by_position(self, sampled_drafts: bool = False, drafter: str = "the drafter") -> None:
        """One clear error where the rule cannot give plain sampling's tokens when sampling by position: a rule
        of ``by_position`` "never" never can, one of "deterministic drafts" not with drafts sampled from q."""
        if self.by_position == "never":
            raise ValueError(
                f"acceptance {self.name!r} cannot give plain sampling's tokens (sample_by_position): it accepts "
                "a drafted token by its own test, whatever the target draws; use 'exact-match'"
            )
        if sampled_drafts and self.by_position != "any drafts":
            raise ValueError(
                f"acceptance {self.name!r} cannot give plain sampling's tokens (sample_by_position) with "
                f"{drafter}'s drafts sampled from q: it accepts x with probability above p(x); use acceptance "
                "'exact-match' or greedy drafts"
            )

    def check_tree(self) -> None:
        """One clear error where the rule has no tree form."""
        if self.paths_only:
            raise ValueError(
                f"acceptance_rule {self.name!r} verifies path drafts only: use a path drafter (e.g. SuffixDecoding() "
                "without tree=True) or acceptance_rule 'token', whose recursive rule verifies trees"
            )

    def accept_path(self, p: mx.array, draft: list[int], q: mx.array | None, draws: list[int] | None) -> PathResult:
        raise NotImplementedError

    def accept_tree(
        self, p: mx.array, tokens: list[int], parents: list[int], q: mx.array | None, draws: list[int] | None
    ) -> TreeResult:
        raise NotImplementedError

    def path(self, p: mx.array, draft: list[int], q: mx.array | None, draws: list[int] | None = None) -> PathResult:
        """Sampled acceptance of a path draft: (accepted count, emitted tokens, acceptance probabilities).
        ``p``: target distributions [k + 1, vocab]; ``q``: the drafter's [k, vocab] or None (one-hot);
        ``draws``: the target's token at each row sampled by position (the rule's decisions coupled to them)."""
        if draws is not None:
            self.check_by_position(q is not None)
        return self.accept_path(p, draft, q, draws)

    def tree(
        self,
        p: mx.array,
        tokens: list[int],
        parents: list[int],
        q: mx.array | None,
        draws: list[int] | None = None,
    ) -> TreeResult:
        """Sampled acceptance of a token tree: (accepted nodes root to leaf, emitted tokens, probabilities);
        ``draws``: the target's token at each tree row sampled by position. A path-only rule verifies a tree
        that is a path as a path."""
        if draws is not None:
            self.check_by_position(q is not None)
        if self.paths_only and is_path(parents):
            n, emitted, probs = self.accept_path(p, tokens, q, draws)
            return list(range(n)), emitted, probs
        self.check_tree()
        return self.accept_tree(p, tokens, parents, q, draws)


Rule = TypeVar("Rule", bound=type[AcceptanceRule])
RULES: Registry[type[AcceptanceRule]] = Registry("acceptance rule", package="specbench.core.rules")


def register_rule(rule: Rule) -> Rule:
    """Register the decorated ``AcceptanceRule`` subclass under its ``name``."""
    if rule.by_position not in BY_POSITION:
        raise ValueError(f"rule {rule.name!r}: by_position must be one of {', '.join(BY_POSITION)}")
    RULES.add(rule.name, rule)
    return rule


def rule_names() -> tuple[str, ...]:
    """Every registered rule's name, in registration order."""
    return RULES.names()


def rule_for(rule: AcceptanceRule | str, **parameters: Any) -> AcceptanceRule:
    """``rule`` itself, or the rule registered by that name with ``parameters`` (its defaults for the rest);
    an unknown name or parameter is one clear error."""
    if isinstance(rule, AcceptanceRule):
        return rule
    if not isinstance(rule, str) or rule not in RULES:
        lossy = [name for name, kind in RULES.items() if not kind.lossless]
        raise ValueError(
            f"acceptance_rule must be one of {', '.join(rule_names())} (lossy: {', '.join(lossy)}) or an "
            f"AcceptanceRule, got {rule!r}"
        )
    kind = RULES[rule]
    known = [field.name for field in dataclasses.fields(kind)]
    unknown = [name for name in parameters if name not in known]
    if unknown:
        raise ValueError(
            f"acceptance rule {rule!r} takes {', '.join(known) or 'no parameters'}, got {', '.join(unknown)}"
        )
    return kind(**parameters)


@register_rule
@dataclass(frozen=True)
class TokenRule(AcceptanceRule):
    """Token-wise min(1, p/q) with residual resampling (Leviathan et al.; Chen et al.); SpecInfer's recursion over a
    tree's siblings. Lossless."""

    name: ClassVar[str] = "token"
    description: ClassVar[str] = "min(1, p/q) with residual resampling (lossless)"

    def accept_path(self, p, draft, q, draws):
        return accept_sampled(p, draft, q, draws)

    def accept_tree(self, p, tokens, parents, q, draws):
        return accept_tree_sampled(p, tokens, parents, q, draws)


@register_rule
@dataclass(frozen=True)
class ExactMatch(AcceptanceRule):
    """mlx-lm's rule: a draft token is accepted iff it equals the target's own sample there. Lossless for any
    drafter; q is not used."""

    name: ClassVar[str] = "exact-match"
    description: ClassVar[str] = "mlx-lm's: a draft token is kept iff it equals the target's sample (lossless)"
    by_position: ClassVar[str] = "any drafts"

    def accept_path(self, p, draft, q, draws):
        """mlx-lm's rule: sample the target's token y_i from p_i at every position (``draws`` when sampled by
        position); accept draft token i iff it equals y_i (while all before it were accepted); emit y at the first
        mismatch, or the bonus y_k. Acceptance probability at a reached position: p_i(d_i)."""
        check_tables(p, len(draft), None, self.name)
        if draws is not None:
            check_draws(draws, len(draft) + 1, None, self.name)
        path, emitted, probs = self.accept_tree(p, draft, list(range(-1, len(draft) - 1)), q, draws)
        return len(path), emitted, probs

    def accept_tree(self, p, tokens, parents, q, draws):
        check_tables(p, len(tokens), None, self.name)
        targets = draws if draws is not None else mx.random.categorical(mx.log(p)).tolist()
        path, emitted = accept_tree_greedy(tokens, parents, targets)
        drafted = p[mx.array([parent + 1 for parent in parents]), mx.array(tokens)] if tokens else mx.zeros((0,))
        return path, emitted, [float(x) for x in drafted.tolist()]


@register_rule
@dataclass(frozen=True)
class Block(AcceptanceRule):
    """Block verification (Sun et al., "Block Verification Accelerates Speculative Decoding"): the drafted prefix
    accepted jointly, with the paper's residual. Lossless; never accepts fewer tokens than "token" in expectation.
    Paths only."""

    name: ClassVar[str] = "block"
    description: ClassVar[str] = "block verification, the prefix accepted jointly (lossless; paths only)"
    paths_only: ClassVar[bool] = True

    def accept_path(self, p, draft, q, draws):
        """Block verification (Sun et al., Algorithm 2): with eta_i uniform, accept the longest prefix
        tau = max{i : eta_i <= h_i} (0 if none), then sample the next token from p_k when tau = k, else from
        normalize(max(w_tau p_tau - q_tau, 0)). The output is distributed as plain sampling's, and the
        probability that the first i tokens are accepted, given them, is w_i >= the token-wise rule's
        prod_j min(1, p_j/q_j). Returns (tau, emitted tokens, the prefix weights w_1..w_k).

        ``draws`` (sampling by position; deterministic drafts only): tau is the longest prefix equal to the draws and
        the draw after it is emitted. With q one-hot, w_i = prod_j p_j(d_j) is the chance of that prefix and the
        residual is p without the next draft token, the law of the draw given it differs: the rule, coupled."""
        k = len(draft)
        check_tables(p, k, q, self.name)
        if draws is not None:
            check_draws(draws, k + 1, q, self.name)
        coins = mx.random.uniform(shape=(k + 1,)) if draws is None else mx.zeros((k + 1,))
        mx.eval(p, coins)
        p_rows = np.array(p.astype(mx.float32), dtype=np.float64)
        if q is not None:
            q_rows = np.array(q.astype(mx.float32), dtype=np.float64)
        else:  # a deterministic drafter: one-hot at the draft
            q_rows = np.zeros((k, p_rows.shape[-1]))
            q_rows[np.arange(k), draft] = 1.0
        w, h, _ = block_weights(p_rows, q_rows, draft)
        if draws is not None:
            tau = next((i for i in range(k) if draft[i] != draws[i]), k)
            return tau, list(draft[:tau]) + [int(draws[tau])], [float(x) for x in w[1:]]
        uniform = np.array(coins, dtype=np.float64)
        tau = max((i for i in range(1, k + 1) if uniform[i - 1] <= h[i]), default=0)
        if tau == k:
            row = p_rows[k] / p_rows[k].sum()
        else:
            row = block_residual(p_rows[tau], q_rows[tau], w[tau])
        return tau, list(draft[:tau]) + [inverse_cdf(row, float(uniform[k]))], [float(x) for x in w[1:]]


@dataclass(frozen=True)
class PassingRule(AcceptanceRule):
    """A lossy rule that tests each drafted token against the target's p alone (``passes``): it keeps the longest
    drafted prefix (on a tree, root path) whose every token passes, and samples the next token from p where it
    ends. Acceptance probabilities are 1 or 0 (passed or not). A subclass implements ``passes``."""

    lossless: ClassVar[bool] = False
    by_position: ClassVar[str] = "never"

    def passes(self, p: mx.array, tokens: mx.array) -> mx.array:
        """Whether each token passes, given the target's distribution of its row: ``p`` [n, vocab], ``tokens``
        [n] -> bool [n]."""
        raise NotImplementedError

    def accept_path(self, p, draft, q, draws):
        path, emitted, probs = self.accept_tree(p, draft, list(range(-1, len(draft) - 1)), q, draws)
        return len(path), emitted, probs

    def accept_tree(self, p, tokens, parents, q, draws):
        """Of the root-to-node paths whose every node passes its parent row's test, the longest (the first in
        node order among equals), as Medusa's typical acceptance on trees; the next token from p at its end."""
        check_tables(p, len(tokens), None, self.name)
        rows = mx.array([parent + 1 for parent in parents], dtype=mx.int32)
        passes = self.passes(p[rows], mx.array(tokens, dtype=mx.int32)) if tokens else mx.zeros((0,), dtype=mx.bool_)
        samples = mx.random.categorical(mx.log(p))
        mx.eval(passes, samples)
        passed = passes.tolist()
        kids = children(parents)
        best: list[int] = []
        frontier: list[list[int]] = [[c] for c in kids[-1] if passed[c]]
        while frontier:
            path = frontier.pop(0)
            if len(path) > len(best):
                best = path
            frontier += [path + [c] for c in kids[path[-1]] if passed[c]]
        last = best[-1] + 1 if best else 0
        return best, [tokens[i] for i in best] + [int(samples[last].item())], [1.0 if x else 0.0 for x in passed]


def drafted_probabilities(p: mx.array, tokens: mx.array) -> mx.array:
    """Each row's probability of its token: ``p`` [n, vocab], ``tokens`` [n] -> [n]."""
    return mx.take_along_axis(p, tokens[:, None], axis=-1)[:, 0]


@register_rule
@dataclass(frozen=True)
class Typical(PassingRule):
    """Medusa's typical acceptance with its thresholds ``epsilon`` and ``delta``: a drafted token x passes iff
    p(x) > min(epsilon, delta * exp(-H(p))). Lossy."""

    name: ClassVar[str] = "typical"
    description: ClassVar[str] = "Medusa's typical acceptance, p(x) > min(epsilon, delta exp(-H(p))) (lossy)"
    epsilon: float = TYPICAL_EPSILON
    delta: float = TYPICAL_DELTA

    def __post_init__(self) -> None:
        allowed = f"in (0, 1] (Medusa's defaults: epsilon {TYPICAL_EPSILON}, delta {TYPICAL_DELTA})"
        real(f"{self.name} epsilon", self.epsilon, 0.0, 1.0, allowed, above=True)
        real(f"{self.name} delta", self.delta, 0.0, 1.0, allowed, above=True)

    def passes(self, p: mx.array, tokens: mx.array) -> mx.array:
        entropy = -mx.sum(mx.where(p > 0, p * mx.log(mx.maximum(p, 1e-30)), 0.0), axis=-1)
        return drafted_probabilities(p, tokens) > mx.minimum(self.epsilon, self.delta * mx.exp(-entropy))


def block_weights(p: np.ndarray, q: np.ndarray, draft: list[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Block verification's quantities for one draft (Sun et al., Algorithm 2), in float64.

    ``p``: target distributions [k + 1, vocab]; ``q``: the drafter's [k, vocab] (one-hot rows for a
    deterministic drafter). Returns (w, h, residual_mass): w[i] = min(1, w[i-1] p(d_i) / q(d_i)) with
    w[0] = 1 (the prefix weights, i = 0..k); residual_mass[i] = sum_x max(w[i] p_i(x) - q_i(x), 0)
    (i = 0..k-1); h[i] (i = 1..k) the probability with which the prefix of i tokens is accepted when
    tried: residual_mass[i] / (residual_mass[i] + 1 - w[i]) for i < k (1 where w[i] = 1), h[k] = w[k].
    h[0] is 1 (the empty prefix is always accepted)."""
    k = len(draft)
    check_tables(p, k, q, "block")
    rows = np.arange(k)
    ratio = p[rows, draft] / np.maximum(q[rows, draft], 1e-300)
    w = np.ones(k + 1)
    for i in range(k):
        w[i + 1] = min(1.0, w[i] * ratio[i])
    residual_mass = np.maximum(w[:k, None] * p[:k] - q, 0.0).sum(axis=1)
    h = np.ones(k + 1)
    for i in range(1, k):
        h[i] = 1.0 if w[i] >= 1.0 else residual_mass[i] / (residual_mass[i] + 1.0 - w[i])
    if k:
        h[k] = w[k]
    return w, h, residual_mass


def block_residual(p_row: np.ndarray, q_row: np.ndarray, weight: float) -> np.ndarray:
    """The distribution of the token after a prefix accepted with weight w that the next draft token did
    not extend: normalize(max(w p - q, 0)); p itself where that is all zeros (then it is never used)."""
    residual = np.maximum(weight * p_row - q_row, 0.0)
    total = residual.sum()
    return residual / total if total > 0 else p_row / p_row.sum()
