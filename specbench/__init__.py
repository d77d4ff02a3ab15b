"""specbench: a research workbench for speculative decoding on MLX."""

import os

# specbench promises greedy output equal to plain decoding; on CUDA that needs MLX's own attention
# kernels (what Metal runs): cuDNN's decoding attention depends on the KV buffer's layout
# (specbench.exact). They are the default unless the user set the variable; MLX reads it when it
# first runs attention, so importing specbench before that is enough. No effect on Metal or CPU.
os.environ.setdefault("MLX_CUDA_USE_CUDNN_SDPA", "0")

from specbench.drafters import Draft, Drafter, PromptLookup
from specbench.core.engine import GenerateOptions, Generation, generate, speculative_generate
from specbench.core.log import StepLog, StepRecord
from specbench.models.mtp import attach_mtp  # MTP heads: attach a checkpoint's multi-token-prediction head
from specbench.core.policies import DraftPolicy


def load(name_or_path: str, **kwargs):
    """Load a model and tokenizer: an embedded short name, a local folder, or anything mlx_lm.load takes."""
    from specbench.models.load import load as _load

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
