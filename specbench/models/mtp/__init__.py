"""Multi-token-prediction heads: build, attach from a checkpoint, save, extract (training lives in
``specbench.train.mtp_training``)."""

from specbench.models.mtp.attach import attach_mtp, extract_mtp, get_head, load_head, save_head
from specbench.models.mtp.head import MtpModule, build_head

__all__ = [
    "MtpModule",
    "attach_mtp",
    "build_head",
    "extract_mtp",
    "get_head",
    "load_head",
    "save_head",
]
