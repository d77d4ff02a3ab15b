"""Figures of the notebooks, reports and command line (matplotlib), with one colour scheme (``style``).

Each figure function takes polars frames or cost profiles and returns a Figure; ``save_figure`` writes one
atomically. Notebooks call ``figures.<name>``; the command line imports ``bench`` and ``save_compare_figure``
from their modules.
"""

from specbench.report.figures.compare import compare_figure
from specbench.report.figures.components import component_stack, costs_by_length
from specbench.report.figures.cost import break_even, break_even_map, measured_vs_predicted, verify_costs
from specbench.report.figures.policies import policy_ranking
from specbench.report.figures.reference import batch_beside_reference, beside_reference
from specbench.report.figures.steps import step_timeline
from specbench.report.figures.style import (
    COLOURS,
    DRAFTER_COLOURS,
    drafter_colour,
    drafter_order,
    model_colours,
    model_family,
    save_figure,
)
from specbench.report.figures.sweeps import (
    acceptance_vs_temperature,
    accepted_vs_k,
    category_speedups,
    per_position,
    rule_positions,
    rule_shifts,
    rules_by_drafter,
    rules_vs_temperature,
    speedup_vs_k,
    token_histograms,
)
from specbench.report.figures.traces import cumulative_saved, per_turn

__all__ = [
    "batch_beside_reference",
    "break_even_map",
    "beside_reference",
    "rule_positions",
    "rule_shifts",
    "rules_by_drafter",
    "rules_vs_temperature",
    "compare_figure",
    "COLOURS",
    "DRAFTER_COLOURS",
    "accepted_vs_k",
    "acceptance_vs_temperature",
    "break_even",
    "category_speedups",
    "component_stack",
    "costs_by_length",
    "cumulative_saved",
    "drafter_colour",
    "drafter_order",
    "measured_vs_predicted",
    "model_colours",
    "model_family",
    "per_position",
    "per_turn",
    "policy_ranking",
    "save_figure",
    "speedup_vs_k",
    "step_timeline",
    "token_histograms",
    "verify_costs",
]
