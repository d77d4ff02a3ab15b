"""Shared fixtures: tiny random-weight models built in the test, float32.

The whole session runs with a temporary ``SPECBENCH_HOME``, set here before any test runs (specbench reads it
when it needs the folder), so tests never read or write the user's cache (calibrations, profiles). Embedded
models built in the user's home are linked into it by name, so they are not converted again; a missing one is
built in the temporary home.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import pytest
from mlx.utils import tree_map
from mlx_lm.models import switch_layers

# mlx-lm's own greedy decoding, the reference for exactness (the package's one implementation)
from specbench.checks.exactness import mlx_lm_greedy as plain_greedy  # noqa: F401
from specbench.core.draft import Draft, Drafter
from specbench.core.log import StepRecord
from specbench.exact import hooks as exact_hooks


def _session_home() -> Path:
    """A temporary SPECBENCH_HOME for this test session, with the user's complete embedded models linked in."""
    user_home = Path(os.environ.get("SPECBENCH_HOME") or "~/.cache/specbench").expanduser()
    session = Path(tempfile.mkdtemp(prefix="specbench-tests-"))
    atexit.register(shutil.rmtree, session, ignore_errors=True)
    built = [m for m in (user_home / "models").glob("*") if (m / "specbench-model.json").is_file()]
    for model in built:
        (session / "models").mkdir(exist_ok=True)
        (session / "models" / model.name).symlink_to(model.resolve(), target_is_directory=True)
    os.environ["SPECBENCH_HOME"] = str(session)
    return session


SESSION_HOME = _session_home()


def _batched_forwards_row_invariant() -> bool:
    """Whether this device computes the tiny models' w-row forwards bit for bit as w single-row steps, probed
    (``specbench.exact.probe_ops``: matmul and attention at widths 2-8): the CPU on MLX's reference BLAS does; an
    optimized BLAS (OpenBLAS: from 4 rows on) and GPUs do not, which is what exact verification is for."""
    if mx.default_device().type == mx.DeviceType.gpu:
        return False
    from specbench.exact import probe_ops

    rows = probe_ops(mx.float32, widths=(2, 3, 4, 5, 8), dim=64)
    return all(r["row_invariant"] for r in rows if r["op"] in ("matmul", "attention"))


#: Tests whose premise is a device whose batched forwards are row-invariant (the CPU on MLX's reference BLAS):
#: a level that splits nothing is exact there. Elsewhere exactness is checked through exact mode.
BATCHED_FORWARDS_ROW_INVARIANT = _batched_forwards_row_invariant()
_needs_bitwise = pytest.mark.skipif(
    not BATCHED_FORWARDS_ROW_INVARIANT,
    reason="needs batched forwards bit-identical to single-row steps (the CPU on MLX's reference BLAS); "
    "this device's are not, and exact mode is tested for it (make test runs it again on the reference BLAS)",
)


def bitwise_forwards(test):
    """Skipped where batched forwards are not row-invariant, and marked ``reference_blas``: ``make test``
    runs the tests so marked a second time on MLX's reference BLAS, where they run."""
    return pytest.mark.reference_blas(_needs_bitwise(test))


SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"

_TINY_LAYERS = dict(
    hidden_size=64,
    num_hidden_layers=2,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=97,
    max_position_embeddings=2048,
)
_TINY_QWEN3 = dict(
    _TINY_LAYERS, model_type="qwen3", head_dim=16, rms_norm_eps=1e-6, tie_word_embeddings=False, rope_theta=10000.0
)
TINY_CONFIGS = {
    "llama": dict(_TINY_LAYERS, model_type="llama", rms_norm_eps=1e-5, tie_word_embeddings=True),
    "qwen3": _TINY_QWEN3,
    "qwen3_moe": dict(
        _TINY_QWEN3,
        model_type="qwen3_moe",
        num_experts=8,
        num_experts_per_tok=2,
        decoder_sparse_step=1,
        moe_intermediate_size=32,
        mlp_only_layers=[],
        norm_topk_prob=True,
    ),
}


def build_tiny(arch: str, seed: int = 0, scale: float = 4.0, **overrides):
    """A random-weight model of mlx-lm's ``arch`` with tiny dims, in float32.

    Weights are scaled up so that greedy continuations are varied rather than one repeated token.
    """
    import importlib

    module = importlib.import_module(f"mlx_lm.models.{arch}")
    config = {**TINY_CONFIGS[arch], **overrides}
    mx.random.seed(seed)
    model = module.Model(module.ModelArgs.from_dict(config))
    model.update(tree_map(lambda p: p * scale if p.ndim == 2 else p, model.parameters()))
    mx.eval(model.parameters())
    return model


@pytest.fixture(autouse=True)
def _close_figures():
    """Figures a test (or a script it runs) leaves open are closed after it: pyplot keeps every open figure."""
    yield
    if "matplotlib.pyplot" in sys.modules:
        sys.modules["matplotlib.pyplot"].close("all")


@pytest.fixture(params=list(TINY_CONFIGS))
def tiny_model(request):
    return build_tiny(request.param)


class ScriptedDrafter(Drafter):
    """Proposes a known continuation, wrong at chosen draft positions.

    ``wrong_at(step, position) -> bool`` decides which draft positions are corrupted, so tests
    control how many tokens each verification accepts.
    """

    name = "scripted"

    def __init__(self, truth: list[int], prompt_len: int, vocab: int, wrong_at=lambda step, i: False):
        self.truth = truth
        self.prompt_len = prompt_len
        self.vocab = vocab
        self.wrong_at = wrong_at
        self.calls = 0

    def draft(self, context, k):
        done = len(context) - self.prompt_len
        tokens = list(self.truth[done : done + k])
        # Run past the known continuation: pad with arbitrary tokens.
        tokens += [1] * (k - len(tokens))
        out = [(t + 1) % self.vocab if self.wrong_at(self.calls, i) else t for i, t in enumerate(tokens)]
        self.calls += 1
        return Draft(out)


def word_tokenizer(roles: tuple[str, ...] = ("user", "assistant")):
    """A word-level tokenizer over the tiny models' 97 ids: <unk>, <eos>, one token per chat role,
    then the words ``w{id}`` (``tokenizer_words(roles)``), with a chat template."""
    from mlx_lm.tokenizer_utils import TokenizerWrapper
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<unk>", "<eos>", *(f"<{r}>" for r in roles)]
    vocab = {
        **{t: i for i, t in enumerate(specials)},
        **{w: i + len(specials) for i, w in enumerate(tokenizer_words(roles))},
    }
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    hf = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", eos_token="<eos>")
    hf.chat_template = (
        "{% for m in messages %}<{{ m['role'] }}> {{ m['content'] }} {% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}"
    )
    return TokenizerWrapper(hf)


def save_tiny_model(folder: Path, model: nn.Module | None = None) -> Path:
    """``model`` (default: ``build_tiny("llama", seed=5)``) saved as an mlx-lm model folder with the word tokenizer."""
    from mlx_lm.utils import save_config, save_model

    save_model(folder, model if model is not None else build_tiny("llama", seed=5))
    save_config(dict(TINY_CONFIGS["llama"]), folder / "config.json")
    word_tokenizer().save_pretrained(str(folder))
    return folder


def write_questions(path: Path, questions) -> Path:
    """``questions`` (``specbench.inputs.prompts.Question``) written as a Spec-Bench-format question.jsonl."""
    records = [{"question_id": q.question_id, "category": q.category, "turns": list(q.turns)} for q in questions]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def write_traces(traces, path: Path) -> Path:
    """``traces`` (``specbench.inputs.traces.Trace``) written in the project's schema: one line a turn, the tools
    and meta on turn 0."""
    records = [
        {"trace": t.id, "turn": i, "messages": turn.messages, "assistant": turn.assistant}
        | ({k: v for k, v in (("tools", t.tools), ("meta", t.meta)) if v} if i == 0 else {})
        for t in traces
        for i, turn in enumerate(t.turns)
    ]
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    return path


def tokenizer_words(roles: tuple[str, ...] = ("user", "assistant")) -> list[str]:
    """The words of ``word_tokenizer(roles)``: ``w{id}`` for the ids after the special tokens."""
    return [f"w{i}" for i in range(2 + len(roles), 97)]


@pytest.fixture
def fresh_calibrations(tmp_path, monkeypatch):
    """Exact-mode calibrations go to a temporary SPECBENCH_HOME and start empty in memory."""
    from specbench.exact import calibration as exact

    monkeypatch.setenv("SPECBENCH_HOME", str(tmp_path))
    exact._calibrations.clear()
    yield
    exact._calibrations.clear()


# -- hybrid (Gated DeltaNet) and MTP-carrying configs ------------------------------------------

QWEN35 = {
    "model_type": "qwen3_5",
    "text_config": {
        "model_type": "qwen3_5_text",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "vocab_size": 101,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
        "linear_key_head_dim": 16,
        "linear_value_head_dim": 16,
        "linear_conv_kernel_dim": 4,
        "full_attention_interval": 4,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000, "partial_rotary_factor": 0.25},
        "mtp_num_hidden_layers": 1,
    },
}
QWEN35_MOE = {
    "model_type": "qwen3_5_moe",
    "text_config": {
        **QWEN35["text_config"],
        "model_type": "qwen3_5_moe_text",
        "intermediate_size": 32,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 32,
        "norm_topk_prob": True,
    },
}
DEEPSEEK = dict(
    model_type="deepseek_v3",
    vocab_size=101,
    hidden_size=64,
    intermediate_size=128,
    moe_intermediate_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=4,
    n_shared_experts=1,
    n_routed_experts=8,
    routed_scaling_factor=2.5,
    kv_lora_rank=32,
    q_lora_rank=48,
    qk_rope_head_dim=8,
    v_head_dim=16,
    qk_nope_head_dim=16,
    topk_method="noaux_tc",
    scoring_func="sigmoid",
    norm_topk_prob=True,
    n_group=2,
    topk_group=1,
    num_experts_per_tok=2,
    moe_layer_freq=1,
    first_k_dense_replace=1,
    max_position_embeddings=4096,
    rms_norm_eps=1e-6,
    rope_theta=10000.0,
    num_nextn_predict_layers=1,
)
QWEN3_NEXT = dict(
    model_type="qwen3_next",
    hidden_size=64,
    num_hidden_layers=4,
    intermediate_size=64,
    num_attention_heads=4,
    linear_num_value_heads=4,
    linear_num_key_heads=2,
    linear_key_head_dim=16,
    linear_value_head_dim=16,
    linear_conv_kernel_dim=4,
    num_experts=8,
    num_experts_per_tok=2,
    decoder_sparse_step=1,
    shared_expert_intermediate_size=32,
    mlp_only_layers=[],
    moe_intermediate_size=32,
    rms_norm_eps=1e-6,
    vocab_size=101,
    num_key_value_heads=2,
    rope_theta=10000.0,
    partial_rotary_factor=0.25,
    max_position_embeddings=4096,
    head_dim=16,
    norm_topk_prob=True,
    tie_word_embeddings=False,
    full_attention_interval=4,
    mtp_num_hidden_layers=1,
)
MIMO = dict(
    model_type="mimo",
    hidden_size=64,
    num_hidden_layers=2,
    intermediate_size=128,
    num_attention_heads=4,
    rms_norm_eps=1e-6,
    vocab_size=101,
    num_key_value_heads=2,
    max_position_embeddings=4096,
    rope_theta=10000.0,
    tie_word_embeddings=False,
    num_nextn_predict_layers=1,
)


def build(config: dict, seed: int = 0, scale: float = 4.0) -> nn.Module:
    from mlx_lm.utils import _get_classes

    model_class, args_class = _get_classes(config)
    mx.random.seed(seed)
    model = model_class(args_class.from_dict(config))
    model.update(tree_map(lambda p: p * scale if p.ndim >= 2 else p, model.parameters()))
    mx.eval(model.parameters())
    model.eval()
    return model


# -- emulating a GPU: multi-row kernels that round differently ---------------------------------

BUMP = {"size": 1e-3}


def bump(out: mx.array) -> mx.array:
    return out + mx.array(BUMP["size"], dtype=out.dtype)


def emulate_gpu(
    monkeypatch,
    attention: bool = True,
    linear_rows: int | None = 1,
    vector: bool = False,
    experts: bool = False,
    size: float = 1e-3,
    beyond_keys: int | None = None,
):
    """Make multi-row calls differ from single-row ones (by ``size``): attention over more than
    one query (several query rows, or one row of each of several batched requests), linear layers over more
    than ``linear_rows`` rows (all leading axes: a batch's B x w rows; None: never), the
    batched-vector linear scheme when ``vector``, and expert products whenever mlx-lm sorts the
    routed tokens. ``beyond_keys``: a device whose attention kernels switch past that many keys: attention over
    more than one query computes each row as a one-query call does (row-invariant, whatever the CPU's own kernel
    does) up to ``BUMP["beyond_keys"]`` keys, and differs past them (a test may move the threshold later)."""
    monkeypatch.setitem(BUMP, "size", size)
    monkeypatch.setitem(BUMP, "beyond_keys", beyond_keys)
    if attention:
        sdpa = mx.fast.scaled_dot_product_attention

        def variant_sdpa(q, k, v, *args, scale, mask=None, **kwargs):
            rows = q.shape[-2]
            many = rows > 1 or q.shape[0] > 1
            if not many or BUMP["beyond_keys"] is None:
                out = sdpa(q, k, v, *args, scale=scale, mask=mask, **kwargs)
                return bump(out) if many else out
            prefix = k.shape[-2] - rows
            parts = []
            for i in range(rows):
                n = prefix + i + 1 if isinstance(mask, str) else k.shape[-2]
                row_mask = mask[..., i : i + 1, :n] if isinstance(mask, mx.array) else None
                one = mx.contiguous(q[..., i : i + 1, :])
                parts.append(sdpa(one, k[..., :n, :], v[..., :n, :], *args, scale=scale, mask=row_mask, **kwargs))
            out = mx.concatenate(parts, axis=-2)
            return bump(out) if k.shape[-2] > BUMP["beyond_keys"] else out

        monkeypatch.setattr(mx.fast, "scaled_dot_product_attention", variant_sdpa)
    if linear_rows is not None:
        owners = ((nn.Linear, "__call__"), (nn.QuantizedLinear, "__call__"), (nn.Embedding, "as_linear"))
        for owner, attribute in owners:
            original = owner.__dict__[attribute]

            def variant(self, x, _original=original):
                out = _original(self, x)
                return bump(out) if x.size // x.shape[-1] > linear_rows else out

            monkeypatch.setattr(owner, attribute, variant)
    if vector:
        for name in ("_linear_vector", "_embedding_vector"):
            original = getattr(exact_hooks, name)
            monkeypatch.setattr(exact_hooks, name, lambda self, x, _original=original: bump(_original(self, x)))
    if experts:
        original = switch_layers.SwitchGLU.__dict__["__call__"]

        def variant_experts(self, x, indices):
            out = original(self, x, indices)
            return bump(out) if indices.size >= 64 else out

        monkeypatch.setattr(switch_layers.SwitchGLU, "__call__", variant_experts)


# Step-log records as the engine writes them (``gen.log.records``), for the run-speed analysis.


def step_record(
    kind: str, seconds: float, draft_s: float = 0.0, draft_tokens=(), emitted: int = 1, k_requested: int = 0
) -> StepRecord:
    return StepRecord(
        step=0,
        position=0,
        kind=kind,
        verify_s=seconds,
        draft_s=draft_s,
        draft_tokens=list(draft_tokens),
        emitted=emitted,
        k_requested=k_requested,
    )


def plain_run_log(step: float, n: int = 40) -> list[StepRecord]:
    return [step_record("prefill", 5 * step)] + [step_record("plain", step) for _ in range(n)]


def auto_run_log(step: float, n: int = 40) -> list[StepRecord]:
    """A stretch with a shadow draft, two verifications costing 2.5 steps, then a long plain stretch."""
    head = [step_record("prefill", 5 * step), step_record("plain", step, 0.1 * step, [7, 8])]
    head += [step_record("plain", step) for _ in range(7)]
    head += [step_record("verify", 2.5 * step, emitted=2), step_record("verify", 2.5 * step, emitted=1)]
    return head + [step_record("plain", step, 0.1 * step, [9])] + [step_record("plain", step) for _ in range(n)]


def log_seconds(records: list[StepRecord]) -> float:
    return sum(r.verify_s + r.draft_s for r in records)


def pytest_terminal_summary(terminalreporter) -> None:
    """The run's last lines name what its measurements are keyed by: device, versions and the CPU's BLAS."""
    from specbench.common.identity import kernel_key

    terminalreporter.write_line(f"specbench kernels: {kernel_key()}")


@pytest.fixture
def no_forward(model, monkeypatch):
    """The test module's ``model`` fails if it runs: an error raised with this fixture came before any model work."""

    def forward(self, *args, **kwargs):
        raise AssertionError("the model ran before the bad input was reported")

    monkeypatch.setattr(type(model), "__call__", forward)
    monkeypatch.setattr(type(model.model), "__call__", forward)
    return model
