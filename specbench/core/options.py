"""Generation options: shared by plain and speculative decoding, checked before any model work."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from numbers import Integral

from specbench.core.accept import SamplingSettings
from specbench.core.policy_args import real, whole
from specbench.core.rules import AcceptanceRule, rule_for
from specbench.core.verify import VerifyMode, check_verify_mode


@dataclass
class GenerateOptions:
    """Options shared by plain and speculative generation (mlx-lm's names where they exist).

    ``verify``: "exact" computes every row of a verification as serial decoding would (the
    default for greedy decoding), "fast" runs one batched forward (the default when sampling; where the kernels
    run, the exact split at the widths where it was timed cheaper: ``specbench.exact.FastVerifier``).
    ``count_experts``: record the distinct experts each MoE layer touches per step (in the log
    record's ``extra["experts"]``); off by default, and free when off.
    ``acceptance_rule``: the rule that accepts draft tokens when sampling, by name with its default parameters
    ("token", min(1, p/q), the default; the registered rules: ``specbench.core.rules``) or as an
    ``AcceptanceRule`` carrying its parameters (``Typical(epsilon=0.05, delta=0.2)``). At temperature 0 every
    rule is greedy.
    ``sample_by_position``: each output position's token drawn with a key of (``seed``, position), in plain
    decoding and in verification alike, so that speculative sampling gives plain sampling's tokens for the same
    seed where the rule can (``specbench.core.rules`` says which). It needs a seed, and makes "exact" the default
    verify mode. Off: one random stream seeded once (mlx-lm's sampler).
    ``audit``: the share of exact verifications compared with serial steps during generation (0: none; 1: all);
    on a mismatch the generation verifies serially from then on and names the first diverging operation
    (``specbench.exact.audit``; ``stats()["exact_audit"]``).
    """

    max_tokens: int = 256
    stop_token_ids: Sequence[int] = ()
    stop_strings: Sequence[str] = ()
    eos_token_ids: Sequence[int] = ()
    ignore_eos: bool = False
    min_tokens: int = 0
    temperature: float = 0.0
    top_p: float = 1.0
    min_p: float = 0.0
    top_k: int = 0
    seed: int | None = None
    verify: VerifyMode | None = None
    prefill_step_size: int = 2048
    count_experts: bool = False
    acceptance_rule: AcceptanceRule | str = "token"
    sample_by_position: bool = False
    audit: float = 0.0

    def check(self) -> None:
        """Raise one clear ValueError (a bad value) or TypeError (a bad type) for the first invalid option."""
        whole("max_tokens", self.max_tokens, 1)
        whole("min_tokens", self.min_tokens, 0)
        whole("prefill_step_size", self.prefill_step_size, 1)
        real("temperature", self.temperature, 0.0, allowed="a finite number >= 0 (0: greedy)")
        real("top_p", self.top_p, 0.0, 1.0, "in (0, 1] (1 disables it)", above=True)
        real("min_p", self.min_p, 0.0, 1.0, "in [0, 1] (0 disables it)")
        whole("top_k", self.top_k, 0, note="(0 disables it)")
        if self.seed is not None:
            whole("seed", self.seed, 0, 2**64 - 1, "or None")
        if self.verify is not None:
            check_verify_mode(self.verify)
        rule = self.rule  # an unknown name is one clear error
        _flag("sample_by_position", self.sample_by_position)
        if self.sample_by_position:
            if self.seed is None:
                raise ValueError("sample_by_position keys each token's draw by (seed, position): give a seed")
            rule.check_by_position()
        audit = real(
            "audit",
            self.audit,
            0.0,
            1.0,
            "a rate in [0, 1] (the share of exact verifications compared with serial steps; 0: none)",
        )
        if audit > 0 and self.verify_mode == "fast":
            raise ValueError(
                "audit compares exact verifications with serial steps, but verification is fast here (by design it "
                "differs from serial steps): set verify='exact' or audit=0"
            )
        _flag("ignore_eos", self.ignore_eos)
        _flag("count_experts", self.count_experts)
        _token_ids("stop_token_ids", self.stop_token_ids)
        _token_ids("eos_token_ids", self.eos_token_ids)
        _stop_strings(self.stop_strings)

    @property
    def sampling(self) -> SamplingSettings:
        return SamplingSettings(self.temperature, self.top_p, self.min_p, self.top_k)

    @property
    def rule(self) -> AcceptanceRule:
        """The acceptance rule with its parameters."""
        return rule_for(self.acceptance_rule)

    @property
    def verify_mode(self) -> VerifyMode:
        if self.verify is not None:
            return self.verify
        return "exact" if self.temperature == 0 or self.sample_by_position else "fast"


def _flag(name: str, value: object) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {value!r} ({type(value).__name__})")


def _collection(name: str, value: object, of: str) -> Collection:
    """``value`` if it is a list, tuple or set (not text, not a single value), else a TypeError."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Collection):
        raise TypeError(f"{name} must be a list of {of}, got {value!r} ({type(value).__name__})")
    return value


def _token_ids(name: str, value: object) -> None:
    """A list of token ids: integers >= 0."""
    for t in _collection(name, value, "token ids (e.g. [2])"):
        if not isinstance(t, Integral) or isinstance(t, bool):
            raise TypeError(f"{name} must hold token ids (integers >= 0), got {t!r} ({type(t).__name__}) in {value!r}")
        if t < 0:
            raise ValueError(f"{name} must hold token ids (integers >= 0), got {t!r} in {value!r}")


def _stop_strings(value: object) -> None:
    """A list of non-empty strings (a bare string would be read character by character)."""
    for s in _collection("stop_strings", value, 'non-empty strings (e.g. ["\\n\\n"])'):
        if not isinstance(s, str):
            raise TypeError(f"stop_strings must hold non-empty strings, got {s!r} ({type(s).__name__}) in {value!r}")
        if not s:
            raise ValueError(f'stop_strings must hold non-empty strings ("" would stop at once), got {value!r}')


def checked_options(options: GenerateOptions | None) -> GenerateOptions:
    """``options`` (default ``GenerateOptions()``) after ``check()``; a TypeError for anything else."""
    if options is None:
        options = GenerateOptions()
    if not isinstance(options, GenerateOptions):
        raise TypeError(f"options must be a GenerateOptions (e.g. GenerateOptions(max_tokens=64)), got {options!r}")
    options.check()
    return options
