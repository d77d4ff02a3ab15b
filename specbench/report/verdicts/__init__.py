"""The report's words, generated from the numbers the notebooks measured: each notebook's verdict
(``out.verdict(verdicts.<notebook>(...), verdicts.<notebook>_speeds(...))``), the key results it records for the
index (headlines) and the labels and units the index shows them with (``describe``). Nothing here measures.
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
