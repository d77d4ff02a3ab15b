"""specbench.models.load (every kind of name) and the embedded-model registry, on tiny random-weight folders."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import mlx.core as mx
import pytest
from conftest import TINY_CONFIGS, build_tiny
from mlx.utils import tree_flatten

from specbench.models import embedded
from specbench.models import load as models

VOCAB = 257  # 256 byte-level symbols and <eos>


def write_tiny_folder(folder: Path, dtype: mx.Dtype = mx.float32, seed: int = 0):
    """An mlx-lm folder: a tiny llama with a byte-level tokenizer. Returns the model (float32)."""
    from tokenizers import AddedToken, Tokenizer, decoders, pre_tokenizers
    from tokenizers import models as tok_models

    folder.mkdir(parents=True, exist_ok=True)
    model = build_tiny("llama", seed=seed, vocab_size=VOCAB)
    weights = {k: v.astype(dtype) for k, v in tree_flatten(model.parameters())}
    mx.save_safetensors(str(folder / "model.safetensors"), weights)
    config = {**TINY_CONFIGS["llama"], "vocab_size": VOCAB, "eos_token_id": VOCAB - 1}
    (folder / "config.json").write_text(json.dumps(config))
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tokenizer = Tokenizer(tok_models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken("<eos>", special=True)])
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<eos>"})
    )
    return model


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("SPECBENCH_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.fixture
def tiny_registry(monkeypatch):
    """Registers "tiny-test", an embedded model whose builder writes a tiny folder; returns its call log."""
    calls = []

    def build(folder: Path):
        calls.append(folder)
        write_tiny_folder(folder)
        return {"kind": "tiny"}

    monkeypatch.setitem(models.EMBEDDED_MODELS, "tiny-test", models.EmbeddedModel(build, version=1))
    return calls


def test_load_local_folder(tmp_path):
    reference = write_tiny_folder(tmp_path / "m32")
    model, tokenizer = models.load(tmp_path / "m32")
    ids = mx.array(tokenizer.encode("hello world"))[None]
    assert ids.shape[1] == len("hello world")
    assert mx.array_equal(model(ids), reference(ids)).item()
    assert tokenizer.eos_token_id == VOCAB - 1


def test_load_dtype(tmp_path):
    write_tiny_folder(tmp_path / "bf16", dtype=mx.bfloat16)
    model, _ = models.load(str(tmp_path / "bf16"))
    expected = mx.float32 if mx.default_device().type == mx.DeviceType.cpu else mx.bfloat16
    assert {v.dtype for _, v in tree_flatten(model.parameters())} == {expected}
    model, _ = models.load(str(tmp_path / "bf16"), dtype="float16")
    assert {v.dtype for _, v in tree_flatten(model.parameters())} == {mx.float16}
    with pytest.raises(ValueError, match="dtype"):
        models.load(str(tmp_path / "bf16"), dtype="int8")


def test_load_not_found_names_the_model(tmp_path):
    with pytest.raises(FileNotFoundError, match="no-such-model.*smollm2-135m"):
        models.load("no-such-model")
    missing = str(tmp_path / "nowhere" / "model")
    with pytest.raises(FileNotFoundError, match="nowhere"):
        models.load(missing)
    with pytest.raises(FileNotFoundError, match="relative-dir"):
        models.load(Path("relative-dir"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no config.json"):
        models.load(tmp_path / "empty")
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(FileNotFoundError, match="is a file"):
        models.load(tmp_path / "file.txt")
    (tmp_path / "damaged").mkdir()
    (tmp_path / "damaged" / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="damaged/config.json is not valid JSON"):
        models.load(tmp_path / "damaged")
    (tmp_path / "damaged" / "config.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="damaged/config.json must hold a JSON object, not list"):
        models.load(tmp_path / "damaged")
    write_tiny_folder(tmp_path / "cut")
    weights = tmp_path / "cut" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:500])
    with pytest.raises(ValueError, match=f"cannot load the model folder {tmp_path / 'cut'}: .*incomplete download"):
        models.load(tmp_path / "cut")
    with pytest.raises(ValueError, match="smollm2-135m"):
        models.embedded_model_path("no-such-model")


def test_load_synthetic_shapes():
    model, tokenizer = models.load("synthetic:qwen3-8b-tiny", seed=1)
    assert tokenizer is None and model.specbench_name == "synthetic:qwen3-8b-tiny-fp32"
    deeper, _ = models.load("synthetic:qwen3-8b-tiny", layers=3)
    assert len(deeper.model.layers) == 3
    with pytest.raises(ValueError, match="synthetic"):
        models.load("smollm2-135m", layers=3)


def test_load_a_miniature_of_a_folder(tmp_path):
    write_tiny_folder(tmp_path / "m")
    model, tokenizer = models.load(f"tiny:{tmp_path / 'm'}", seed=3)
    assert model.specbench_name == f"tiny:{tmp_path / 'm'}"
    assert len(model.model.layers) == 2 and model.args.hidden_size == 64 and model.args.vocab_size == VOCAB
    assert {v.dtype for _, v in tree_flatten(model.parameters())} == {mx.float32}
    assert tokenizer.eos_token_id == VOCAB - 1
    again, _ = models.load(f"tiny:{tmp_path / 'm'}", seed=3)
    assert mx.array_equal(model.model.embed_tokens.weight, again.model.embed_tokens.weight).item()
    with pytest.raises(FileNotFoundError, match="tiny:no-such-model needs an embedded model name"):
        models.load("tiny:no-such-model")


def test_embedded_model_builds_once(home, tiny_registry):
    assert models.embedded_model_path("tiny-test") == home / "models" / "tiny-test"
    model, tokenizer = models.load("tiny-test")
    models.load("tiny-test")
    assert len(tiny_registry) == 1
    marker = json.loads((home / "models" / "tiny-test" / embedded.COMPLETE_MARKER).read_text())
    assert marker["version"] == 1 and marker["kind"] == "tiny"
    assert model(mx.array(tokenizer.encode("hi"))[None]).shape == (1, 2, VOCAB)


def test_setup_builds_the_embedded_models_marked_for_it(home, tiny_registry, monkeypatch):
    tiny = models.EMBEDDED_MODELS["tiny-test"]
    on_demand = models.EmbeddedModel(tiny.build, version=1, in_setup=False)
    monkeypatch.setattr(models, "EMBEDDED_MODELS", {"tiny-test": tiny, "tiny-on-demand": on_demand})
    assert models.setup() == [home / "models" / "tiny-test"]
    assert models.setup() == [home / "models" / "tiny-test"]
    assert len(tiny_registry) == 1
    models.setup(force=True)
    assert len(tiny_registry) == 2
    assert models.setup(every=True) == [home / "models" / "tiny-test", home / "models" / "tiny-on-demand"]
    assert len(tiny_registry) == 3  # the on-demand model, once asked for


def test_the_report_loads_no_embedded_model_that_setup_leaves_out():
    from specbench.report.profiles import PROFILES

    left_out = {name for name, spec in models.EMBEDDED_MODELS.items() if not spec.in_setup}
    assert "smollm2-135m-moe" in left_out
    text = json.dumps(PROFILES)
    assert not [name for name in left_out if f'"{name}"' in text]


def test_new_builder_version_rebuilds(home, tiny_registry, monkeypatch):
    models.ensure_embedded("tiny-test")
    entry = models.EMBEDDED_MODELS["tiny-test"]
    monkeypatch.setitem(models.EMBEDDED_MODELS, "tiny-test", models.EmbeddedModel(entry.build, version=2))
    folder = models.ensure_embedded("tiny-test")
    assert len(tiny_registry) == 2
    assert json.loads((folder / embedded.COMPLETE_MARKER).read_text())["version"] == 2
    assert not [p.name for p in folder.parent.iterdir() if p.name.startswith(".")]


def test_interrupted_build_leaves_nothing(home):
    folder = home / "models" / "broken"

    def build(tmp: Path):
        (tmp / "model.safetensors").write_bytes(b"partial")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        embedded.install(folder, build, version=1)
    assert not folder.exists()
    assert list(folder.parent.iterdir()) == []

    def build_ok(tmp: Path):
        (tmp / "done").write_text("ok")

    embedded.install(folder, build_ok, version=1)
    assert (folder / "done").read_text() == "ok"
    assert embedded.is_complete(folder, version=1)


def test_stale_temporary_folders_are_removed(home):
    folder = home / "models" / "m"
    stale = home / "models" / ".m.tmp-abc"
    stale.mkdir(parents=True)
    old = time.time() - 2 * embedded.STALE_TEMP_SECONDS
    os.utime(stale, (old, old))
    fresh = home / "models" / ".m.tmp-def"  # possibly another process's build in progress
    fresh.mkdir()
    embedded.install(folder, lambda tmp: None, version=1)
    assert not stale.exists() and fresh.exists()


def test_concurrent_installs_agree(home):
    folder = home / "models" / "m"
    barrier = threading.Barrier(2)
    results = []

    def build(tmp: Path):
        barrier.wait(timeout=10)  # both builds run: one rename wins, the other discards its copy
        (tmp / "weights").write_text(tmp.name)

    threads = [threading.Thread(target=lambda: results.append(embedded.install(folder, build, 1))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [folder, folder]
    assert embedded.is_complete(folder, 1)
    assert [p.name for p in folder.parent.iterdir()] == ["m"]
