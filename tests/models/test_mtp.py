"""MTP heads: attach from Qwen3.5-, DeepSeek- and MiMo-format checkpoints, draft exactly, bad input."""

from __future__ import annotations

import json
import re
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from conftest import DEEPSEEK, MIMO, QWEN3_NEXT, QWEN35, QWEN35_MOE, build, build_tiny, plain_greedy
from mlx.utils import tree_flatten, tree_map

from specbench import DraftPolicy, GenerateOptions, speculative_generate
from specbench.drafters.mtp import MtpHead
from specbench.models.mtp import attach_mtp, build_head, extract_mtp, save_head
from specbench.models.mtp.layouts import MIMO as MIMO_LAYOUT
from specbench.models.mtp.layouts import find_mtp

PROMPT = [5, 17, 3, 9, 5, 17, 3, 9, 5, 17, 44, 2, 8]


def random_head(model: nn.Module, seed: int = 1, **kwargs):
    mx.random.seed(seed)
    head = build_head(model, **kwargs)
    # Non-trivial norm weights, so a missed zero-centring shows.
    head.update(tree_map(lambda p: p + 0.3 * mx.random.normal(p.shape) if p.ndim == 1 else p * 3, head.parameters()))
    mx.eval(head.parameters())
    return head


def qwen_hf_tensors(params: dict[str, mx.array], prefix: str, experts: str) -> dict[str, mx.array]:
    """mlx-lm parameters -> raw Hugging Face Qwen3.5 tensors (zero-centred norms, HF conv and experts)."""
    out = {}
    for k, v in params.items():
        if v.ndim == 1 and re.search(r"norm\.weight$", k) and "linear_attn.norm" not in k:
            v = v - 1.0
        if k.endswith("conv1d.weight"):
            v = v.moveaxis(2, 1)
        m = re.match(r"(.*\.mlp)\.switch_mlp\.(gate_proj|up_proj|down_proj)\.weight$", k)
        if m and experts == "per_expert":
            for e in range(v.shape[0]):
                out[f"{prefix}{m[1]}.experts.{e}.{m[2]}.weight"] = v[e]
            continue
        if m and experts == "fused":
            if m[2] == "gate_proj":
                up = params[k.replace("gate_proj", "up_proj")]
                out[f"{prefix}{m[1]}.experts.gate_up_proj"] = mx.concatenate([v, up], axis=-2)
            elif m[2] == "down_proj":
                out[f"{prefix}{m[1]}.experts.down_proj"] = v
            continue
        out[prefix + k] = v
    return out


def write_qwen_checkpoint(folder: Path, config: dict, model: nn.Module, head, experts: str = "fused") -> Path:
    """A sharded Hugging Face Qwen3.5 / Qwen3-Next checkpoint: body in shard 1, MTP tensors and lm_head in 2.

    Qwen3.5 bodies use fused experts (as mlx-lm reads them), Qwen3-Next bodies per-expert ones;
    ``experts`` picks the MTP layer's layout.
    """
    folder.mkdir(parents=True, exist_ok=True)
    params = dict(tree_flatten(model.parameters()))
    if "text_config" in config:  # Qwen3.5: model.language_model.*, fused experts
        body = {
            k.replace("language_model.model.", "model.language_model."): v
            for k, v in params.items()
            if k.startswith("language_model.model.")
        }
        shard1 = qwen_hf_tensors(body, "", "fused")
        shard2 = {"lm_head.weight": params["language_model.lm_head.weight"]}
    else:  # Qwen3-Next: model.*, experts one by one
        shard1 = qwen_hf_tensors({k: v for k, v in params.items() if k.startswith("model.")}, "", "per_expert")
        shard2 = {"lm_head.weight": params["lm_head.weight"]}
    if head is not None:
        shard2.update(qwen_hf_tensors(dict(tree_flatten(head.parameters())), "mtp.", experts))
    files = {"model-00001-of-00002.safetensors": shard1, "model-00002-of-00002.safetensors": shard2}
    weight_map = {}
    for name, tensors in files.items():
        mx.save_safetensors(str(folder / name), tensors, metadata={"format": "pt"})
        weight_map.update({k: name for k in tensors})
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def assert_same_head(head, reference) -> None:
    got = dict(tree_flatten(head.parameters()))
    want = dict(tree_flatten(reference.parameters()))
    assert got.keys() == want.keys()
    for k in want:
        np.testing.assert_allclose(np.array(got[k]), np.array(want[k]), rtol=1e-6, atol=1e-6, err_msg=k)


def speculative_equals_plain(model, n: int = 24, k: int = 3, verify: str = "fast") -> MtpHead:
    ref = plain_greedy(model, PROMPT, n)
    drafter = MtpHead(model)
    gen = speculative_generate(
        model, PROMPT, GenerateOptions(max_tokens=n, verify=verify), drafter=drafter, policy=DraftPolicy.fixed(k)
    )
    assert list(gen) == ref
    verifies = [r for r in gen.log if r.kind == "verify"]
    assert verifies and all(r.k_drafted >= 1 for r in verifies)
    return gen


@pytest.mark.parametrize(
    "config,experts",
    [(QWEN35, "fused"), (QWEN35_MOE, "fused"), (QWEN35_MOE, "per_expert"), (QWEN3_NEXT, "per_expert")],
    ids=["qwen3_5", "qwen3_5_moe-fused", "qwen3_5_moe-per-expert", "qwen3_next"],
)
def test_qwen_sharded_checkpoint_attach_and_draft(tmp_path, config, experts):
    import mlx_lm

    model = build(config)
    head = random_head(model)
    folder = write_qwen_checkpoint(tmp_path / "ckpt", config, model, head, experts)
    loaded, _ = mlx_lm.load(str(folder))  # mlx-lm drops the mtp.* tensors
    assert "mtp" not in loaded
    # Only the shard holding MTP tensors is opened: the body's shard may be gone.
    (folder / "model-00001-of-00002.safetensors").unlink()
    attached = attach_mtp(loaded, folder)
    assert loaded["mtp"] is attached
    assert_same_head(attached, head)
    speculative_equals_plain(loaded)


def test_drafter_feeds_real_hidden_states():
    """Mid-generation, the head's cache holds exactly what the real context gives, no speculative entries."""
    model = build(QWEN35)
    model.mtp = random_head(model)
    drafter = MtpHead(model)
    gen = speculative_generate(
        model, PROMPT, GenerateOptions(max_tokens=40), drafter=drafter, policy=DraftPolicy.fixed(4)
    )
    for i, _ in enumerate(gen):
        if i == 25:
            break
    assert any(r.accepted < r.k_drafted for r in gen.log if r.kind == "verify")
    tokens = PROMPT + gen.tokens
    drafter._drop_speculative()
    fed = drafter.fed
    assert drafter.cache[0].offset == fed and fed >= len(PROMPT)
    # The head run once over the real context: pairs (hidden at i, token i+1).
    hidden = model.language_model.model(mx.array([tokens[:fed]]))
    embeds = model.language_model.model.embed_tokens(mx.array([tokens[1 : fed + 1]]))
    ref_cache = model.mtp.make_cache()
    model.mtp(embeds, hidden, ref_cache)
    np.testing.assert_allclose(
        np.array(drafter.cache[0].keys[..., :fed, :]), np.array(ref_cache[0].keys[..., :fed, :]), atol=1e-4
    )


def deepseek_mtp_tensors(model: nn.Module, seed: int = 2) -> dict[str, mx.array]:
    """Random DeepSeek-V3 MTP tensors in the checkpoint's own naming (model.layers.N.*)."""
    args = model.args
    n = args.num_hidden_layers
    mx.random.seed(seed)
    h, heads = args.hidden_size, args.num_attention_heads

    def r(*shape: int) -> mx.array:
        return mx.random.normal(shape) * 0.3

    p = f"model.layers.{n}."
    t = {
        p + "enorm.weight": 1 + r(h),
        p + "hnorm.weight": 1 + r(h),
        p + "eh_proj.weight": r(h, 2 * h),
        p + "shared_head.norm.weight": 1 + r(h),
        p + "shared_head.head.weight": model.lm_head.weight,
        p + "embed_tokens.weight": model.model.embed_tokens.weight,
        p + "input_layernorm.weight": 1 + r(h),
        p + "post_attention_layernorm.weight": 1 + r(h),
        p + "self_attn.q_a_proj.weight": r(args.q_lora_rank, h),
        p + "self_attn.q_a_layernorm.weight": 1 + r(args.q_lora_rank),
        p + "self_attn.q_b_proj.weight": r(heads * (args.qk_nope_head_dim + args.qk_rope_head_dim), args.q_lora_rank),
        p + "self_attn.kv_a_proj_with_mqa.weight": r(args.kv_lora_rank + args.qk_rope_head_dim, h),
        p + "self_attn.kv_a_layernorm.weight": 1 + r(args.kv_lora_rank),
        p + "self_attn.kv_b_proj.weight": r(heads * (args.qk_nope_head_dim + args.v_head_dim), args.kv_lora_rank),
        p + "self_attn.o_proj.weight": r(h, heads * args.v_head_dim),
        p + "mlp.gate.weight": r(args.n_routed_experts, h),
        p + "mlp.gate.e_score_correction_bias": r(args.n_routed_experts),
        p + "mlp.shared_experts.gate_proj.weight": r(args.moe_intermediate_size, h),
        p + "mlp.shared_experts.up_proj.weight": r(args.moe_intermediate_size, h),
        p + "mlp.shared_experts.down_proj.weight": r(h, args.moe_intermediate_size),
    }
    for e in range(args.n_routed_experts):
        t[p + f"mlp.experts.{e}.gate_proj.weight"] = r(args.moe_intermediate_size, h)
        t[p + f"mlp.experts.{e}.up_proj.weight"] = r(args.moe_intermediate_size, h)
        t[p + f"mlp.experts.{e}.down_proj.weight"] = r(h, args.moe_intermediate_size)
    return t


def test_deepseek_checkpoint_attach_and_draft(tmp_path):
    model = build(DEEPSEEK)
    tensors = deepseek_mtp_tensors(model)
    file = tmp_path / "model.safetensors"
    mx.save_safetensors(str(file), tensors)
    (tmp_path / "config.json").write_text(json.dumps(DEEPSEEK))
    head = attach_mtp(model, tmp_path)
    n = DEEPSEEK["num_hidden_layers"]
    np.testing.assert_array_equal(np.array(head.fc.weight), np.array(tensors[f"model.layers.{n}.eh_proj.weight"]))
    np.testing.assert_array_equal(
        np.array(head.layers[0].mlp.switch_mlp.up_proj.weight[3]),
        np.array(tensors[f"model.layers.{n}.mlp.experts.3.up_proj.weight"]),
    )
    assert head.chain_normed is False and head.array_mask is True
    speculative_equals_plain(model)


def test_mimo_checkpoint_attach_and_draft(tmp_path):
    model = build(MIMO)
    ref = random_head(model, layout=MIMO_LAYOUT)
    tensors = {}
    renames = {
        "fc.": "input_proj.",
        "pre_fc_norm_embedding.": "token_layernorm.",
        "pre_fc_norm_hidden.": "hidden_layernorm.",
        "norm.": "final_layernorm.",
        "layers.0.": "",
    }
    for k, v in tree_flatten(ref.parameters()):
        src = next(s for s in renames if k.startswith(s))
        tensors["model.mtp_layers.0." + renames[src] + k[len(src) :]] = v
    file = tmp_path / "mimo.safetensors"
    mx.save_safetensors(str(file), tensors, metadata={"config": json.dumps(MIMO)})
    head = attach_mtp(model, file)
    assert head.hidden_first is True
    assert_same_head(head, ref)
    speculative_equals_plain(model)


def test_extract_then_attach(tmp_path):
    import mlx_lm

    model = build(QWEN35_MOE)
    head = random_head(model)
    folder = write_qwen_checkpoint(tmp_path / "ckpt", QWEN35_MOE, model, head, "per_expert")
    out = extract_mtp(folder, tmp_path / "head.safetensors")
    names = list(mx.load(str(out)))
    assert names and all(n.startswith("mtp.") for n in names)
    loaded, _ = mlx_lm.load(str(folder))
    assert_same_head(attach_mtp(loaded, out), head)


def test_quantized_body_quantizes_head_and_keeps_router_8bit(tmp_path):
    import mlx_lm
    from mlx_lm.utils import quantize_model

    model = build(QWEN35_MOE)
    head = random_head(model)
    folder = write_qwen_checkpoint(tmp_path / "ckpt", QWEN35_MOE, model, head)
    loaded, _ = mlx_lm.load(str(folder))
    loaded, _ = quantize_model(loaded, {}, group_size=32, bits=4, quant_predicate=loaded.quant_predicate)
    attached = attach_mtp(loaded, folder)
    layer = attached.layers[0]
    assert isinstance(attached.fc, nn.QuantizedLinear) and attached.fc.bits == 4 and attached.fc.group_size == 32
    assert layer.self_attn.q_proj.bits == 4
    assert layer.mlp.switch_mlp.gate_proj.bits == 4
    assert layer.mlp.gate.bits == 8 and layer.mlp.shared_expert_gate.bits == 8
    # Quantization error only: the quantized head drafts nearly what the float head drafts.
    ref = attach_mtp(build(QWEN35_MOE), folder)
    x = mx.random.normal((1, 3, 64))
    got, want = attached(x, x)[1], ref(x, x)[1]
    assert float(mx.abs(got - want).max()) < 0.5 * float(mx.abs(want).max())


def test_saved_head_round_trip_on_llama(tmp_path):
    model = build_tiny("llama")
    head = random_head(model)
    path = save_head(head, tmp_path / "head.safetensors", {"model_type": "llama", "hidden_size": 64})
    attached = attach_mtp(model, path)
    assert_same_head(attached, head)
    speculative_equals_plain(model, k=2)


# -- bad input ------------------------------------------------------------------------------------
def test_missing_path():
    with pytest.raises(FileNotFoundError, match="not found"):
        attach_mtp(build_tiny("llama"), "/nonexistent/mtp.safetensors")


def test_checkpoint_without_mtp_tensors(tmp_path):
    model = build(QWEN35)
    folder = write_qwen_checkpoint(tmp_path / "ckpt", QWEN35, model, head=None)
    with pytest.raises(ValueError, match=r"holds no MTP tensors.*mlx-lm drop"):
        attach_mtp(model, folder)


def test_missing_tensor_is_named(tmp_path):
    model = build(QWEN35)
    tensors = qwen_hf_tensors(dict(tree_flatten(random_head(model).parameters())), "mtp.", "fused")
    del tensors["mtp.layers.0.self_attn.k_proj.weight"]
    mx.save_safetensors(str(tmp_path / "h.safetensors"), tensors)
    with pytest.raises(ValueError, match=r"lacks the MTP tensor 'mtp\.layers\.0\.self_attn\.k_proj\.weight'"):
        attach_mtp(model, tmp_path / "h.safetensors")


def test_wrong_shape_is_named(tmp_path):
    model = build(QWEN35)
    tensors = qwen_hf_tensors(dict(tree_flatten(random_head(model).parameters())), "mtp.", "fused")
    tensors["mtp.fc.weight"] = mx.zeros((64, 64))
    mx.save_safetensors(str(tmp_path / "h.safetensors"), tensors)
    with pytest.raises(ValueError, match=r"'mtp\.fc\.weight' has shape \(64, 64\) but .* needs \(64, 128\)"):
        attach_mtp(model, tmp_path / "h.safetensors")


def test_moe_checkpoint_for_dense_model_is_refused(tmp_path):
    moe = build(QWEN35_MOE)
    tensors = qwen_hf_tensors(dict(tree_flatten(random_head(moe).parameters())), "mtp.", "fused")
    mx.save_safetensors(str(tmp_path / "h.safetensors"), tensors)
    with pytest.raises(ValueError, match=r"lacks the MTP tensor 'mtp\.layers\.0\.mlp\.gate_proj\.weight'"):
        attach_mtp(build(QWEN35), tmp_path / "h.safetensors")


def test_checkpoint_of_another_family(tmp_path):
    ds = build(DEEPSEEK)
    mx.save_safetensors(str(tmp_path / "ds.safetensors"), deepseek_mtp_tensors(ds))
    with pytest.raises(
        ValueError, match=r"DeepSeek-V3/GLM-4.5-style MTP tensors .* model is qwen3_5.*another model family"
    ):
        attach_mtp(build(QWEN35), tmp_path / "ds.safetensors")
    folder = write_qwen_checkpoint(tmp_path / "ckpt", QWEN35, build(QWEN35), random_head(build(QWEN35)))
    with pytest.raises(ValueError, match=r"is a qwen3_5 checkpoint but the model is llama"):
        attach_mtp(build_tiny("llama"), folder)


def test_drafter_without_head():
    with pytest.raises(ValueError, match="no MTP head"):
        MtpHead(build_tiny("llama"))


def test_find_mtp_layouts():
    names = ["mtp.fc.weight", "mtp.layers.0.mlp.gate.weight", "model.layers.0.x"]
    (found,) = find_mtp(names, 4)
    assert found.layout.name == "qwen" and found.names == names[:2]
    (found,) = find_mtp(["model.layers.61.eh_proj.weight", "model.layers.61.enorm.weight", "model.layers.60.x"], 61)
    assert found.layout.name == "deepseek" and found.prefix == "model.layers.61."


# -- training and the MoE twin ----------------------------------------------------------------------
def tiny_model_folder(folder: Path, seed: int = 0) -> Path:
    """A tiny llama folder mlx-lm loads, with a small byte-level BPE tokenizer trained on stdlib text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from specbench.train.mtp_data import stdlib_files

    folder.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator([p.read_text() for p in stdlib_files()[:10]], trainer)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>"})
    )
    config = dict(
        model_type="llama",
        hidden_size=64,
        num_hidden_layers=2,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        rms_norm_eps=1e-5,
        vocab_size=tok.get_vocab_size(),
        tie_word_embeddings=True,
        max_position_embeddings=2048,
        eos_token_id=0,
        rope_theta=10000.0,
    )
    model = build(config, seed)
    mx.save_safetensors(str(folder / "model.safetensors"), dict(tree_flatten(model.parameters())))
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_train_mtp_quick_cli(tmp_path):
    """`specbench train-mtp --quick`: data, training, evaluation, a head that attaches and drafts exactly."""
    import mlx_lm

    from specbench.cli import main

    folder = tiny_model_folder(tmp_path / "model")
    out = tmp_path / "out"
    assert main(["train-mtp", "--model", str(folder), "--out", str(out), "--quick"]) == 0
    result = json.loads((out / "mtp.json").read_text())
    assert result["training"]["steps"] == 30
    tokens = result["data"]["tokens"]
    assert tokens["chat"] > 0 and tokens["continued"] > 0 and tokens["code"] > 0
    metrics = result["metrics"]
    for kind in ("natural", "code", "generated"):
        trained, init = metrics["teacher_forced"][kind], metrics["teacher_forced_at_init"][kind]
        assert trained["windows"] > 0
        assert trained["loss"] < init["loss"]  # the head learned the model's next-next distribution
    assert metrics["decoding"]["chat"]["verifies"] > 0
    model, _ = mlx_lm.load(str(folder))
    attach_mtp(model, out / "mtp.safetensors")
    speculative_equals_plain(model, k=2)


def test_moe_twin_computes_the_dense_function(tmp_path):
    import mlx_lm

    from specbench.models.moe_twin import build_twin, twin_head_file

    dense_dir = tiny_model_folder(tmp_path / "dense")
    twin_dir = tmp_path / "twin"
    twin_dir.mkdir()
    build_twin(dense_dir, twin_dir, num_experts=8, top_k=2)
    dense, _ = mlx_lm.load(str(dense_dir))
    twin, _ = mlx_lm.load(str(twin_dir))
    assert twin.model_type == "mixtral" and twin.layers[0].block_sparse_moe.switch_mlp.gate_proj.weight.shape[0] == 8
    x = mx.array([PROMPT * 3])
    np.testing.assert_allclose(np.array(twin(x)), np.array(dense(x)), rtol=1e-4, atol=1e-4)
    # Tokens really route to different experts.
    gates = twin.layers[0].block_sparse_moe.gate(twin.model.embed_tokens(x))
    assert len(set(mx.argmax(gates, axis=-1).reshape(-1).tolist())) > 2
    assert plain_greedy(twin, PROMPT, 16) == plain_greedy(dense, PROMPT, 16)
    # The twin's head: the dense head's MLP as 8 experts; it drafts what the dense head drafts.
    head = random_head(dense)
    dense_file = save_head(head, tmp_path / "dense_head.safetensors", {"model_type": "llama"})
    twin_file = twin_head_file(dense_file, tmp_path / "twin_head.safetensors")
    attach_mtp(dense, dense_file)
    twin_head = attach_mtp(twin, twin_file)
    assert twin_head.layers[0].block_sparse_moe.switch_mlp.up_proj.weight.shape[0] == 8
    runs = {}
    for name, model in (("dense", dense), ("twin", twin)):
        gen = speculative_generate(
            model, PROMPT, GenerateOptions(max_tokens=16), drafter=MtpHead(model), policy=DraftPolicy.fixed(2)
        )
        runs[name] = (list(gen), [r.draft_tokens for r in gen.log if r.kind == "verify"])
    assert runs["dense"] == runs["twin"]


def test_sampled_drafts_report_their_distribution():
    model = build_tiny("llama")
    model.mtp = random_head(model)
    drafter = MtpHead(model, temperature=0.8)
    gen = speculative_generate(
        model,
        PROMPT,
        GenerateOptions(max_tokens=12, temperature=0.8, seed=3),
        drafter=drafter,
        policy=DraftPolicy.fixed(3),
    )
    assert len(list(gen)) == 12
    hidden = model.model(mx.array([PROMPT]))
    drafter.begin(PROMPT, hidden[:, :-1])
    drafter.observe([4], hidden[:, -1:])
    draft = drafter.draft(PROMPT + [4], 3)
    assert len(draft.tokens) == 3 and draft.probs.shape == (3, 97)
    np.testing.assert_allclose(np.array(draft.probs.sum(axis=-1)), 1.0, rtol=1e-5)
    assert all(float(draft.probs[i, t]) > 0 for i, t in enumerate(draft.tokens))


# -- the embedded model with its shipped head ------------------------------------------------------
@pytest.fixture(scope="module")
def embedded():
    from specbench import load
    from specbench.models.mtp.attach import SHIPPED_HEADS, assets_dir

    if not (assets_dir() / SHIPPED_HEADS["smollm2-135m"]).exists():
        pytest.skip("the trained head of smollm2-135m is not in specbench/assets/mtp yet")
    return load("smollm2-135m")


def test_embedded_model_mtp_greedy_equals_plain(embedded):
    from specbench.drafters import make_drafter
    from specbench.inputs.prompts import render_prompt

    model, tokenizer = embedded
    drafter = make_drafter("mtp", model=model, model_name="smollm2-135m")
    prompt = render_prompt(tokenizer, "Write a Python function that checks whether a number is prime.")
    ref = plain_greedy(model, prompt, 32)
    gen = speculative_generate(
        model, prompt, GenerateOptions(max_tokens=32), drafter=drafter, policy=DraftPolicy.fixed(3)
    )
    assert list(gen) == ref
    verifies = [r for r in gen.log if r.kind == "verify"]
    first = sum(r.accepted >= 1 for r in verifies) / len(verifies)
    assert first > 0.3  # a trained head: a random one is almost never right


def test_chat_prompts_draw_on_topics_arithmetic_names_and_passages():
    from specbench.train.mtp_data import chat_prompts

    passage = (
        "The harbour opened in the spring of that year after a long winter of repairs. Fishing boats returned to "
        "the quay within a week, and the market stalls followed them. By summer the town had doubled its visitors."
    )
    docs = [("textwrap.dedent", "Remove any common leading whitespace from every line in the given text.")]
    prompts = chat_prompts(5000, docs, seed=3, texts=[passage])
    assert len(prompts) == len(set(prompts)) > 1000
    assert any("textwrap.dedent" in p for p in prompts)
    assert any(any(s in p for s in ("The harbour", "Fishing boats", "By summer")) for p in prompts)
    assert any(re.search(r"\d+x \+ \d+ = \d+|multiplied by|km in", p) for p in prompts)
    assert chat_prompts(5000, docs, seed=3, texts=[passage]) == prompts  # seeded
