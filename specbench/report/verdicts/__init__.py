"""The report's words, generated from the numbers the notebooks measured: each notebook's verdict, the key
results it records (headlines) and the labels and units the index shows them with.

- Verdicts: one or two sentences per notebook. A notebook ends with ``out.verdict(verdicts.<notebook>(...))``;
  the index shows one verdict per notebook at the top.
- Headlines: the key results a notebook records for the index (``out.summary(**verdicts.sweep_headline(...))``).
- Speeds: what a verdict says of speed, as typed statements (``SpeedVerdict``), stored beside its words
  (``out.verdict(verdicts.sweep(...), verdicts.sweep_speeds(...))``) and checked across pages (``report.consistency``).
- Labels: ``describe(key, value)`` gives a label that says what a key result is and the value with its unit,
  e.g. ``("SmolLM2-135M-MoE: verify cost c(2), engine overhead included", "3.04 plain steps")``; keys without
  an entry are shown as they are.

Nothing here measures: every function reads the frames, profiles and stats the library returned.
"""

from specbench.report.verdicts.labels import (
    describe,
    describe_profile,
    profile_headline,
    sweep_headline,
    trace_headline,
)
from specbench.report.verdicts.notebooks import (
    INCONCLUSIVE,
    LOSES,
    PAYS,
    acceptance_rules,
    batch_break_even,
    bench,
    break_even,
    explorer,
    quickstart,
    sample,
    sampling,
    simulated_logs,
    speed,
    speed_word,
    sweep,
    traces,
    tree_vs_path,
    verify_cost,
)
from specbench.report.verdicts.policy_verdicts import policies
from specbench.report.verdicts.reference import batch_reference_contrast, reference_contrast, reference_stacks
from specbench.report.verdicts.speeds import (
    SpeedVerdict,
    policy_speeds,
    quickstart_speeds,
    sweep_speeds,
    trace_speeds,
)

__all__ = [
    "sweep_headline",
    "trace_headline",
    "profile_headline",
    "describe_profile",
    "describe",
    "PAYS",
    "LOSES",
    "INCONCLUSIVE",
    "speed_word",
    "speed",
    "sample",
    "verify_cost",
    "quickstart",
    "sweep",
    "break_even",
    "batch_break_even",
    "traces",
    "bench",
    "sampling",
    "acceptance_rules",
    "explorer",
    "simulated_logs",
    "tree_vs_path",
    "batch_reference_contrast",
    "reference_contrast",
    "reference_stacks",
    "policies",
    "SpeedVerdict",
    "sweep_speeds",
    "quickstart_speeds",
    "trace_speeds",
    "policy_speeds",
]
