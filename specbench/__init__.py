"""specbench: a research workbench for speculative decoding on MLX."""

import os

# specbench promises greedy output equal to plain decoding; on CUDA that needs MLX's own attention
# kernels (what Metal runs): cuDNN's decoding attention depends on the KV buffer's layout
# (specbench.exact). They are the default unless the user set the variable; MLX reads it when it
# first runs attention, so importing specbench before that is enough. No effect on Metal or CPU.
os.environ.setdefault("MLX_CUDA_USE_CUDNN_SDPA", "0")

from specbench.core.batch import BatchGeneration
from specbench.core.draft import Draft, Drafter
from specbench.core.engine import Generation
from specbench.core.log import StepLog, StepRecord
from specbench.core.options import GenerateOptions
from specbench.core.policies import DraftPolicy
from specbench.decoding import generate, generate_batch, speculative_generate, speculative_generate_batch
from specbench.drafters import DraftModel, EarlyExit, MtpHead, Oracle, PromptLookup, SuffixDecoding
from specbench.inputs.prompts import render_prompt
from specbench.models.load import load
from specbench.models.mtp import attach_mtp  # MTP heads: attach a checkpoint's multi-token-prediction head

__all__ = [
    "BatchGeneration",
    "Draft",
    "DraftModel",
    "DraftPolicy",
    "Drafter",
    "EarlyExit",
    "GenerateOptions",
    "Generation",
    "MtpHead",
    "Oracle",
    "PromptLookup",
    "StepLog",
    "StepRecord",
    "SuffixDecoding",
    "attach_mtp",
    "generate",
    "generate_batch",
    "load",
    "render_prompt",
    "speculative_generate",
    "speculative_generate_batch",
]
