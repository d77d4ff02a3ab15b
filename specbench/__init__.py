"""specbench: a research workbench for speculative decoding on MLX."""

from .drafters import Draft, Drafter, PromptLookup
from .engine import GenerateOptions, Generation, generate, speculative_generate
from .log import StepLog, StepRecord
from .mtp import attach_mtp  # MTP heads: attach a checkpoint's multi-token-prediction head
from .policies import DraftPolicy


def load(name_or_path: str, **kwargs):
    """Load a model and tokenizer: an embedded short name, a local folder, or anything mlx_lm.load takes."""
    from .models import load as _load

    return _load(name_or_path, **kwargs)


__all__ = [
    "Draft",
    "Drafter",
    "DraftPolicy",
    "GenerateOptions",
    "Generation",
    "PromptLookup",
    "StepLog",
    "StepRecord",
    "attach_mtp",
    "generate",
    "load",
    "speculative_generate",
]
