"""Policies confirmed by real runs: measured speedup over plain decoding beside the speedup the simulator
predicted for the same requests, and the residual (measured over predicted, minus 1).

For each request the model decodes plainly and then with the policy (greedy, so the tokens are the same and
the simulator's replay of the recorded output is the run's own steps); a policy's measured speedup is plain
decode seconds over speculative decode seconds, summed over the requests. Its interval resamples whole
requests (``paired.sums_interval``); with fewer than ``MIN_REQUESTS`` requests it is None (inconclusive).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import polars as pl

from specbench.bench.paired import sums_interval
from specbench.bench.timing import timed_generation
from specbench.core.options import GenerateOptions
from specbench.core.policies import DraftPolicy
from specbench.cost import Profile, drafter_cost, predicted_speedup
from specbench.simulate.policies import policy_copy
from specbench.simulate.simulate import Recorded, model_free_drafter, simulate

#: Requests needed for a bootstrap interval of the measured speedup.
MIN_REQUESTS = 3


def confirm_policies(
    model: Any,
    requests: Sequence[Recorded],
    policies: Sequence[DraftPolicy | str],
    profile: Profile,
    drafter: str = "lookup",
    k: int = 8,
    resamples: int = 2000,
    seed: int = 0,
) -> pl.DataFrame:
    """One row per policy: measured and predicted speedup, the residual and the measured speedup's 95 %
    interval over requests (None: too few requests). ``requests``: recorded greedy outputs of ``model``."""
    rows = []
    d = drafter_cost(model_free_drafter(drafter, 1), profile)
    for spec in policies:
        plain_s, spec_s = [], []
        for request in requests:
            options = GenerateOptions(max_tokens=len(request.output))
            plain = timed_generation(model, request.prompt, options).run
            drafter_ = model_free_drafter(drafter, k)
            run = timed_generation(model, request.prompt, options, drafter_, policy_copy(spec), profile=profile).run
            plain_s.append(float(plain.stats()["decode_s"]))
            spec_s.append(float(run.stats()["decode_s"]))
            if run.tokens != request.output[: len(run.tokens)]:
                raise ValueError(f"request {request.id!r}: the run's tokens differ from its recorded output")
        replay = simulate(list(requests), model_free_drafter(drafter, k), policy_copy(spec), cost=profile)
        predicted = predicted_speedup(replay.records, profile, d, mode=options.verify_mode, tokens="emitted")
        measured = sum(plain_s) / sum(spec_s)
        units = np.column_stack([plain_s, spec_s])
        interval = sums_interval(units, lambda sums: sums[:, 0] / sums[:, 1], resamples, seed, min_units=MIN_REQUESTS)
        low, high = interval or (None, None)
        name = spec if isinstance(spec, str) else spec.name
        rows.append(
            {
                "policy": name,
                "requests": len(requests),
                "measured_speedup": measured,
                "measured_low": low,
                "measured_high": high,
                "predicted_speedup": predicted,
                "residual": measured / predicted - 1.0,
            }
        )
    return pl.DataFrame(rows)
