"""Exact verification: every row of a verify forward computed as serial decoding computes it."""

from specbench.exact.audit import AuditResult, Divergence
from specbench.exact.calibration import (
    CACHE_LENGTHS,
    CALIBRATION_METHOD,
    Calibration,
    WidthCalibration,
    calibrate,
    calibration_dir,
    calibration_key,
    lengths_for,
    load_calibration,
)
from specbench.exact.layout import (
    CUDNN_ATTENTION_ENV,
    clear_rejected,
    cudnn_attention,
    layout_sensitive_attention,
    serial_kv_layout,
)
from specbench.exact.plan import LEVELS, ExactPlan
from specbench.exact.probe import probe_ops
from specbench.exact.verifier import (
    BATCH_LEVEL,
    ExactAuditWarning,
    ExactVerifier,
    FastVerifier,
    batch_verifier,
    exact_mode,
    verifier_for,
)

__all__ = [
    "LEVELS",
    "ExactPlan",
    "serial_kv_layout",
    "CUDNN_ATTENTION_ENV",
    "cudnn_attention",
    "layout_sensitive_attention",
    "clear_rejected",
    "exact_mode",
    "ExactVerifier",
    "FastVerifier",
    "ExactAuditWarning",
    "AuditResult",
    "Divergence",
    "verifier_for",
    "BATCH_LEVEL",
    "batch_verifier",
    "WidthCalibration",
    "Calibration",
    "CALIBRATION_METHOD",
    "calibration_key",
    "CACHE_LENGTHS",
    "lengths_for",
    "calibration_dir",
    "load_calibration",
    "calibrate",
    "probe_ops",
]
