"""Synthetic random-weight models: names, real shapes, quantization like mlx-community, tiny forwards."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx.utils import tree_flatten

from specbench import GenerateOptions, generate
from specbench.core.forward import text_model
from specbench.models import synthetic


def test_names_parse():
    assert synthetic.parse("qwen3-30b-a3b-4bit") == ("qwen3-30b-a3b", False, "4bit")
    assert synthetic.parse("synthetic:qwen3.5-9b-tiny") == ("qwen3.5-9b", True, None)
    assert synthetic.parse("qwen3.5-35b-a3b-tiny-bf16") == ("qwen3.5-35b-a3b", True, "bf16")
    for bad in ("qwen3-8b-q4", "llama-7b", "qwen3-8b-4bits"):
        with pytest.raises(ValueError, match="unknown synthetic model"):
            synthetic.parse(bad)


@pytest.mark.parametrize(
    "name, billions",
    [("qwen3-8b", 8.19), ("qwen3-30b-a3b", 30.53), ("qwen3.5-9b", 8.95), ("qwen3.5-35b-a3b", 34.66)],
)
def test_full_shapes_have_the_published_size(name, billions):
    assert synthetic.parameter_count(name) / 1e9 == pytest.approx(billions, abs=0.01)


def test_full_shape_configs():
    dense, moe = synthetic.config("qwen3-8b"), synthetic.config("qwen3-30b-a3b")
    assert (dense["hidden_size"], dense["num_hidden_layers"], dense["num_key_value_heads"]) == (4096, 36, 8)
    assert (moe["num_experts"], moe["num_experts_per_tok"], moe["moe_intermediate_size"]) == (128, 8, 768)
    hybrid = synthetic.config("qwen3.5-35b-a3b")["text_config"]
    assert (hybrid["num_experts"], hybrid["num_experts_per_tok"], hybrid["full_attention_interval"]) == (256, 8, 4)
    assert synthetic.config("qwen3-8b", layers=4)["num_hidden_layers"] == 4
    with pytest.raises(ValueError, match="layers >= 4"):
        synthetic.config("qwen3.5-9b", layers=2)


@pytest.mark.parametrize("name", [f"{n}-tiny" for n in synthetic.SHAPES])
def test_tiny_models_run(name):
    model = synthetic.build(name)
    vocab = text_model(model).args.vocab_size
    logits = model(mx.array([[1, 2, 3, 4]]))
    assert logits.shape == (1, 4, vocab) and logits.dtype == mx.float32
    assert bool(mx.isfinite(logits).all())
    assert model.specbench_name == f"synthetic:{name}-fp32"
    out = list(generate(model, [5, 6, 7, 8], GenerateOptions(max_tokens=6, ignore_eos=True)))
    assert len(out) == 6 and all(0 <= t < vocab for t in out)


def test_quantized_like_mlx_community():
    model = synthetic.build("qwen3-30b-a3b-tiny", bits=4, dtype="float32")
    layer = model.model.layers[0]
    # The router is quantized at 8 bits (the model's quant_predicate), experts and attention at 4.
    assert isinstance(layer.mlp.gate, nn.QuantizedLinear) and layer.mlp.gate.bits == 8
    assert layer.mlp.switch_mlp.gate_proj.bits == 4 and layer.mlp.switch_mlp.gate_proj.group_size == 64
    assert isinstance(layer.self_attn.q_proj, nn.QuantizedLinear) and layer.self_attn.q_proj.bits == 4
    assert isinstance(model.model.embed_tokens, nn.QuantizedEmbedding)
    # Widths that do not divide by the group size stay unquantized (as mlx_lm.convert leaves them).
    assert not hasattr(layer.mlp.switch_mlp.down_proj, "bits")
    assert model.specbench_name == "synthetic:qwen3-30b-a3b-tiny-4bit"
    assert bool(mx.isfinite(model(mx.array([[1, 2, 3]]))).all())


def test_name_precision_and_overrides():
    dense = synthetic.build("qwen3-8b-tiny-bf16")
    assert dense.model.layers[0].mlp.up_proj.weight.dtype == mx.bfloat16
    hybrid = synthetic.build("qwen3.5-9b-tiny", dtype="bfloat16", layers=8)
    assert len(hybrid.layers) == 8
    # A_log stays float32 in half-precision builds (mlx-lm's cast_predicate).
    assert hybrid.layers[0].linear_attn.A_log.dtype == mx.float32
    assert hybrid.layers[0].linear_attn.in_proj_qkv.weight.dtype == mx.bfloat16
    assert hybrid.specbench_name == "synthetic:qwen3.5-9b-tiny-bf16-8l"
    with pytest.raises(ValueError, match="dtype"):
        synthetic.build("qwen3-8b-tiny", dtype="int8")


def test_seeded():
    a, b, c = (synthetic.build("qwen3-8b-tiny", seed=s) for s in (0, 0, 1))
    wa, wb, wc = (np.array(m.model.layers[0].self_attn.q_proj.weight) for m in (a, b, c))
    assert np.array_equal(wa, wb) and not np.array_equal(wa, wc)


def test_mtp_head_on_hybrids():
    pytest.importorskip("specbench.models.mtp")
    model = synthetic.build("qwen3.5-9b-tiny", mtp=True)
    assert any(name.startswith("mtp.") for name, _ in tree_flatten(model.parameters()))
    with pytest.raises(ValueError, match="no MTP head"):
        synthetic.build("qwen3-8b-tiny", mtp=True)
