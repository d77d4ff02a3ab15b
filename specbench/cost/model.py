"""The cost model: one measured profile per (model, device, BLAS, verify mode), the one every page, policy and
prediction plans with.

``cost_model(model, protocol)`` returns the stored profile while it is ``current`` for the protocol, else measures
it by the protocol and stores it where ``profile_for`` finds it. A noisy measurement (``Profile.noise``) is
measured once more in its noisy modes and the two pooled; what stays noisy stays marked. ``Profile.measured``
records when, how long and under what load.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import mlx.nn as nn

from specbench.common.identity import display_name
from specbench.core.policy_args import whole
from specbench.core.verify import check_verify_mode
from specbench.cost.measure import forget, measure, with_rounds
from specbench.cost.profile import Measurement, Profile, level, load_profile, save_profile


@dataclass(frozen=True)
class Protocol:
    """How the cost model is measured, fixed before the run: widths 1..``widths`` in each of ``verify``'s modes,
    ``offset`` tokens in the cache, ``repeats`` timing rounds after ``warmup`` discarded ones, ``plain_tokens`` plain
    steps per round, and the further context ``lengths``."""

    widths: int = 9
    verify: tuple[str, ...] = ("fast", "exact")
    offset: int = 64
    repeats: int = 5
    warmup: int = 1
    plain_tokens: int = 8
    lengths: tuple[int, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        object.__setattr__(self, "verify", tuple(check_verify_mode(m) for m in self.verify))
        object.__setattr__(self, "lengths", tuple(whole("a cost model's context length", n, 1) for n in self.lengths))
        for name in ("offset", "repeats", "plain_tokens"):
            whole(f"the cost model's {name}", getattr(self, name), 1)
        whole("the cost model's widths", self.widths, 2, 129, "(drafts of 1 to 128 tokens)")
        whole("the cost model's warmup", self.warmup, 0)
        if not self.verify:
            raise ValueError("the cost model needs at least one verify mode")

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "verify": list(self.verify), "lengths": list(self.lengths)}


def current(profile: Profile | None, protocol: Protocol) -> bool:
    """Whether a stored ``profile`` serves as the cost model for ``protocol``: measured in full (not quick), with
    intervals for every mode and width 1..``protocol.widths``, at every context length asked, and not noisy unless
    already measured again (a noisy single measurement is measured again and pooled; what stays noisy after that is
    kept, marked, rather than measured on every run)."""
    if profile is None or profile.quick or (profile.noisy and (profile.measured or Measurement()).measurements < 2):
        return False
    wanted = list(range(1, protocol.widths + 1))
    for mode in protocol.verify:
        widths = profile.widths.get(mode, [])
        if not set(wanted) <= set(widths) or len(profile.intervals.get(mode, [])) != len(widths):
            return False
    return set(protocol.lengths) <= set(profile.context_lengths)


def cost_model(
    model: nn.Module, protocol: Protocol | None = None, progress: Callable[[str], None] | None = None
) -> Profile:
    """The cost model of ``model`` on this device: the stored profile while ``current`` for ``protocol``, else
    measured by it (once more and pooled where the first measurement is noisy) and stored for every page to read."""
    protocol = protocol or Protocol()
    stored = load_profile(model)
    if current(stored, protocol):
        return stored
    say = progress or (lambda _: None)
    say(
        f"measuring the cost model of {display_name(model)}: widths 1-{protocol.widths}, "
        f"{'/'.join(protocol.verify)}, {protocol.repeats} rounds"
    )
    profile = _measured(model, protocol, progress)
    if profile.noisy:
        for mode, reasons in profile.noise.items():
            for reason in reasons:
                say(f"{mode}: {reason}; measuring again (both measurements pooled)")
        # the second measurement times the noisy modes at the protocol's offset only: the other modes and context
        # lengths keep the first's
        again = tuple(m for m in protocol.verify if profile.noise.get(m))
        profile = pooled(profile, _measured(model, dataclasses.replace(protocol, lengths=(), verify=again), progress))
        for mode, reasons in profile.noise.items():
            for reason in reasons:
                say(f"{mode}: still noisy after pooling two measurements: {reason}")
    save_profile(profile)
    forget(model)  # the pages of this process read the stored cost model, not a profile kept in memory
    return profile


def _measured(model: nn.Module, protocol: Protocol, progress: Callable[[str], None] | None) -> Profile:
    load_before, started = _load(), time.perf_counter()
    profile = measure(model, progress=progress, **dataclasses.asdict(protocol))  # its fields are measure's arguments
    seconds = round(time.perf_counter() - started, 1)
    return dataclasses.replace(profile, measured=Measurement(seconds, load_before, _load(), protocol.to_dict()))


def pooled(first: Profile, second: Profile) -> Profile:
    """Two measurements of one protocol as one: every timing round of both (at the protocol's offset) in the modes
    the second measured, the first's alone in the others; the other context lengths are the second's, or the
    first's where the second measured none; the overhead and drafters the second's where it measured them; c(w),
    intervals (their level: that of the mode with the fewest rounds) and the noise checks recomputed."""
    plain_s = [*first.rounds["plain"], *second.rounds["plain"]]
    # each round pairs with the plain step of its own round: the first's rounds come first in both lists
    rounds = {
        m: [[*a, *b] for a, b in zip(first.rounds[m], second.rounds[m])] if m in second.costs else first.rounds[m]
        for m in first.costs
    }
    one, two = first.measured or Measurement(), second.measured or Measurement()
    measured = Measurement(
        round(one.seconds + two.seconds, 1),
        one.load_before,
        two.load_after,
        one.protocol,
        one.measurements + two.measurements,
        sorted(second.costs),
    )
    base = dataclasses.replace(
        first,
        overhead={**first.overhead, **second.overhead},
        drafters=second.drafters or first.drafters,
        lengths=second.lengths or first.lengths,
    )
    fewest = min(len(per_width[0]) for per_width in rounds.values())
    profile = with_rounds(base, plain_s, rounds)
    return dataclasses.replace(profile, repeats=fewest, measured=measured, interval_level=level(fewest))


def describe(profile: Profile) -> str:
    """One line naming the cost model a page plans with: when, how long, under what load, how many rounds."""
    m = profile.measured
    if m is None:
        kind = "a quick profile" if profile.quick else "a stored profile"
        return f"cost model: {kind} of {profile.name}, measured {profile.created or 'at an unknown time'}"
    load = ""
    if m.load_before is not None and m.load_after is not None:
        load = f" at load {m.load_before:.1f}-{m.load_after:.1f}"
    again = f" ({', '.join(m.again)})" if m.again else ""
    pooled_note = f", {m.measurements} measurements pooled{again}" if m.measurements > 1 else ""
    noisy = "; noisy: " + "; ".join(r for rs in profile.noise.values() for r in rs) if profile.noisy else ""
    return (
        f"cost model: {profile.name}, measured {profile.created}{load} in {m.seconds:.0f} s, "
        f"{profile.repeats} rounds{pooled_note}, intervals at {profile.interval_level:.0%}{noisy}"
    )


def _load() -> float | None:
    """The machine's 1-minute load average (None where the system has none)."""
    try:
        return round(os.getloadavg()[0], 2)
    except (OSError, AttributeError):
        return None


__all__ = ["Protocol", "cost_model", "current", "describe", "pooled"]
