"""The rollback of recurrent state: after a partial acceptance, caches hold exactly the accepted tokens' state.

Key-value caches are trimmed (``specbench.core.verify.CacheRollback``). Hybrid models (Qwen3.5, Qwen3-Next) also
hold the recurrent state of their Gated DeltaNet layers in mlx-lm's ``ArraysCache``, which cannot be trimmed: during
a verification those layers run their recurrence one step at a time (the computation serial decoding makes) and keep
each step's recurrent and convolution state, so a rewind restores the state of the last accepted position. The
extra memory is one state per verified position.
"""

from __future__ import annotations

import sys
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from specbench.core.swap import own_class, restore_class, swap_class


def _gated_deltanet(layer: nn.Module) -> nn.Module | None:
    """The Gated DeltaNet mixer inside a decoder layer (``linear_attn`` in qwen3_5 / qwen3_next)."""
    for _, module in layer.named_modules():
        if hasattr(module, "conv1d") and hasattr(module, "A_log") and hasattr(module, "conv_kernel_size"):
            if hasattr(sys.modules.get(type(module).__module__), "gated_delta_update"):
                return module
    return None


class RecurrentRecorder:
    """Records per-step Gated DeltaNet states during a verification and restores one of them."""

    def __init__(self, model: nn.Module, cache: list[Any], indices: list[int]):
        layers = list(model.layers)
        if len(layers) != len(cache):
            raise ValueError(f"the cache has {len(cache)} entries but the model has {len(layers)} layers")
        self.cache = cache
        self.mixers: dict[int, nn.Module] = {}
        for i in indices:
            mixer = _gated_deltanet(layers[i])
            if mixer is None:
                raise ValueError(
                    f"layer {i} ({type(layers[i]).__module__}.{type(layers[i]).__name__}) keeps recurrent "
                    f"state that specbench cannot roll back: exact rollback supports Gated DeltaNet layers "
                    f"(qwen3_5, qwen3_5_moe, qwen3_next); use plain generation for this model"
                )
            self.mixers[i] = mixer
        self.records: dict[int, dict[str, Any]] = {}
        self.width = 0

    def arm(self, width: int) -> None:
        """Record the next forward (of ``width`` positions) through every recurrent layer."""
        self.width = width
        self.records = {i: {"cache": self.cache[i], "conv": [], "states": []} for i in self.mixers}
        for i, mixer in self.mixers.items():
            swap_class(mixer, _RecordingMixer, _specbench_record=self.records[i])

    def recorded(self, i: int, width: int) -> dict[str, Any]:
        """Layer ``i``'s record of the last forward, checked to hold each of its ``width`` steps."""
        rec = self.records[i]
        if len(rec["states"]) != width or len(rec["conv"]) != width:
            raise RuntimeError(f"layer {i}: the verification was not recorded ({len(rec['states'])} of {width} steps)")
        return rec

    def restore(self, num_rejected: int) -> None:
        """Leave each recurrent cache in the state after the accepted positions; stop recording."""
        try:
            if num_rejected > 0:
                accepted = self.width - num_rejected
                if accepted < 1:
                    raise ValueError(f"cannot reject {num_rejected} of {self.width} verified positions")
                for i in self.mixers:
                    rec = self.recorded(i, self.width)
                    self.cache[i][0] = mx.contiguous(rec["conv"][accepted - 1])
                    self.cache[i][1] = rec["states"][accepted - 1]
        finally:
            for mixer in self.mixers.values():
                restore_class(mixer, "_specbench_record")
            self.records = {}


class _RecordingMixer:
    """Mixed in front of a Gated DeltaNet class while a verification is recorded.

    The layer's own ``__call__`` runs unchanged, except that its convolution input is kept
    (the convolution state after step t is rows t .. t+K-2 of it) and its recurrence runs one
    step at a time, keeping each step's state.
    """

    def __call__(self, inputs: mx.array, mask: mx.array | None = None, cache: Any = None) -> mx.array:
        record = self.__dict__.get("_specbench_record")
        if record is None or cache is None or cache is not record["cache"]:
            return super().__call__(inputs, mask, cache)
        module = sys.modules[own_class(self).__module__]
        update = module.gated_delta_update
        conv = self.conv1d
        keep = self.conv_kernel_size - 1

        def recording_conv(x: mx.array) -> mx.array:
            steps = x.shape[1] - keep
            record["conv"].extend(x[:, t + 1 : t + 1 + keep, :] for t in range(steps))
            return conv(x)

        def stepwise_update(q, k, v, a, b, A_log, dt_bias, state=None, mask=None, **kwargs):
            ys = []
            for t in range(q.shape[1]):
                y, state = update(
                    q[:, t : t + 1],
                    k[:, t : t + 1],
                    v[:, t : t + 1],
                    a[:, t : t + 1],
                    b[:, t : t + 1],
                    A_log,
                    dt_bias,
                    state,
                    None if mask is None else mask[:, t : t + 1],
                    **kwargs,
                )
                ys.append(y)
                record["states"].append(state)
            return mx.concatenate(ys, axis=1), state

        self.__dict__["conv1d"] = recording_conv
        module.gated_delta_update = stepwise_update
        try:
            return super().__call__(inputs, mask, cache)
        finally:
            module.gated_delta_update = update
            del self.__dict__["conv1d"]
