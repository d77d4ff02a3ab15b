"""Verify cost: profiles c(w), break-even math, and measuring them."""

from specbench.core.verify import VERIFY_MODES
from specbench.cost.bandwidth import expected_distinct_experts, routing
from specbench.cost.breakeven import (
    best_k,
    break_even_acceptance,
    break_even_tokens,
    drafter_cost,
    expected_tokens,
    preferred_k,
    speedup,
)
from specbench.cost.grid import speedup_grid
from specbench.cost.measure import QUICK_WIDTHS, measure, measure_drafter, profile_for, quick_profile
from specbench.cost.model import Protocol, cost_model, describe
from specbench.cost.predict import acceptance_per_position, predicted_speedup
from specbench.cost.profile import Profile, cost_at, load_profile, profile_path, save_profile
from specbench.cost.reference import Reference, reference_profiles

__all__ = [
    "VERIFY_MODES",
    "QUICK_WIDTHS",
    "Profile",
    "Reference",
    "reference_profiles",
    "profile_path",
    "save_profile",
    "load_profile",
    "measure",
    "measure_drafter",
    "profile_for",
    "cost_model",
    "Protocol",
    "describe",
    "quick_profile",
    "drafter_cost",
    "break_even_tokens",
    "preferred_k",
    "cost_at",
    "expected_tokens",
    "speedup",
    "break_even_acceptance",
    "best_k",
    "predicted_speedup",
    "acceptance_per_position",
    "speedup_grid",
    "expected_distinct_experts",
    "routing",
]
