"""Stored probe verdicts: a probe runs once per device, MLX version, arguments and kernel source.

The function that runs kernels (``qmv_matches``, ``gemv_matches``, ``attention_matches``) is replaced by a
counting stand-in; a "new process" is this process with its in-memory verdicts forgotten.
"""

from __future__ import annotations

import json
import sys
import warnings

import mlx.core as mx
import pytest

from specbench.common.files import DamagedFileWarning
from specbench.exact import calibration_dir
from specbench.kernels import probe as kernel_probe
from specbench.kernels import verdicts


@pytest.fixture
def probed(tmp_path, monkeypatch):
    """CUDA pretended, an empty store in a temporary home, and a stand-in probe: ``calls`` lists each
    (kernel, variant) it ran; variants in ``exact`` are exact, those in ``broken`` raise."""
    monkeypatch.setenv("SPECBENCH_HOME", str(tmp_path))
    monkeypatch.setattr(kernel_probe, "cuda_available", lambda: True)
    monkeypatch.setattr(kernel_probe, "_warned", set())
    verdicts.forget()
    state = {"calls": [], "exact": {"mul-add", "fma", "source"}, "broken": set()}

    def stand_in(kernel):
        def matches(*args, **kwargs):
            variant = args[-1] if kernel != "qmv_rows" else args[3]
            state["calls"].append((kernel, variant))
            if variant in state["broken"]:
                raise RuntimeError("nvrtc: compilation failed")
            return {"exact": variant in state["exact"], "mismatches": []}

        return matches

    monkeypatch.setattr(kernel_probe, "qmv_matches", stand_in("qmv_rows"))
    monkeypatch.setattr(kernel_probe, "gemv_matches", stand_in("gemv_rows"))
    monkeypatch.setattr(kernel_probe, "attention_matches", stand_in("attention_rows"))
    yield state
    verdicts.forget()


def _variants() -> tuple[str | None, str | None, str | None]:
    return (
        kernel_probe.qmv_variant(mx.bfloat16, 4, 64),
        kernel_probe.gemv_variant(mx.bfloat16),
        kernel_probe.attention_variant(mx.bfloat16, 128),
    )


def test_a_later_call_and_a_later_process_read_the_verdict_and_run_no_probe(probed):
    assert _variants() == ("mul-add", "fma", "source")
    assert probed["calls"] == [("qmv_rows", "mul-add"), ("gemv_rows", "fma"), ("attention_rows", "source")]
    assert verdicts.store_path().parent == calibration_dir()  # beside exact mode's calibrations
    stored = json.loads(verdicts.store_path().read_text())["verdicts"]
    assert {e["kernel"]: e["variant"] for e in stored.values()} == {
        "qmv_rows": "mul-add",
        "gemv_rows": "fma",
        "attention_rows": "source",
    }
    probed["calls"].clear()
    assert _variants() == ("mul-add", "fma", "source")  # the same process: from memory
    verdicts.forget()  # a new process: from the store
    assert _variants() == ("mul-add", "fma", "source")
    assert probed["calls"] == []


def test_verdicts_are_kept_per_argument(probed):
    kernel_probe.qmv_variant(mx.bfloat16, 4, 64)
    kernel_probe.qmv_variant(mx.bfloat16, 8, 64)
    kernel_probe.qmv_variant(mx.float16, 4, 64)
    assert len(probed["calls"]) == 3
    verdicts.forget()
    kernel_probe.qmv_variant(mx.float16, 4, 64)
    assert len(probed["calls"]) == 3
    assert len(json.loads(verdicts.store_path().read_text())["verdicts"]) == 3


def test_a_changed_kernel_source_is_probed_again(probed, tmp_path, monkeypatch):
    source = tmp_path / "qmv_source.py"
    source.write_text("the kernel as it was\n")
    kernel_module = type(kernel_probe)("specbench_test_kernel_source")
    kernel_module.__file__ = str(source)
    monkeypatch.setitem(sys.modules, kernel_module.__name__, kernel_module)
    monkeypatch.setitem(verdicts.SOURCES, "qmv_rows", (kernel_module.__name__,))
    assert kernel_probe.qmv_variant(mx.bfloat16, 4, 64) == "mul-add"
    verdicts.forget()
    assert kernel_probe.qmv_variant(mx.bfloat16, 4, 64) == "mul-add" and len(probed["calls"]) == 1
    source.write_text("the kernel, changed\n")
    verdicts.forget()
    probed["exact"] = {"fma"}  # the changed kernel needs another variant
    assert kernel_probe.qmv_variant(mx.bfloat16, 4, 64) == "fma"
    assert probed["calls"][1:] == [("qmv_rows", "mul-add"), ("qmv_rows", "fma")]


def test_the_real_sources_are_digested():
    for kernel in verdicts.SOURCES:
        assert len(verdicts.source_digest(kernel)) == 16
    assert verdicts.source_digest("qmv_rows") != verdicts.source_digest("attention_rows")


def test_a_damaged_store_is_ignored_with_one_warning_and_written_anew(probed):
    kernel_probe.qmv_variant(mx.bfloat16, 4, 64)
    verdicts.store_path().write_text('{"verdicts": {"abc": ')  # cut short
    verdicts.forget()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert kernel_probe.qmv_variant(mx.bfloat16, 4, 64) == "mul-add"
    assert [type(w.message) for w in caught] == [DamagedFileWarning]
    assert "kernel probe verdicts" in str(caught[0].message)
    assert len(probed["calls"]) == 2  # probed again
    stored = json.loads(verdicts.store_path().read_text())["verdicts"]
    assert [e["variant"] for e in stored.values()] == ["mul-add"]
    verdicts.forget()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert kernel_probe.qmv_variant(mx.bfloat16, 4, 64) == "mul-add"
    assert len(probed["calls"]) == 2


@pytest.mark.parametrize(
    "forge, reason",
    [
        (lambda e: e.update(variant="fast-and-wrong"), "its variant 'fast-and-wrong' is none of qmv_rows's"),
        (lambda e: e.update(device="gpu:another card"), "its device are not those it is stored for"),
        (lambda e: e.update(source="0" * 16), "its source are not those it is stored for"),
        (lambda e: e.update(mlx="0.0.1", specbench="0.0.1"), "its mlx, specbench are not those it is stored for"),
        (lambda e: e["args"].update(bits=8), "its args are not those it is stored for"),
        (lambda e: e.update(reason=["not", "text"]), "its reason is not text"),
    ],
)
def test_a_forged_verdict_is_set_aside_with_a_warning_and_probed_anew(probed, forge, reason):
    """A stored verdict is trusted only when it holds what its key is made of and a variant the kernel has:
    otherwise the store is moved aside with one warning naming it, and the kernel is probed again."""
    probed["exact"] = {"fma"}
    assert kernel_probe.qmv_variant(mx.bfloat16, 4, 64) == "fma"
    path = verdicts.store_path()
    data = json.loads(path.read_text())
    ((key, entry),) = data["verdicts"].items()
    forge(entry)
    path.write_text(json.dumps(data))
    verdicts.forget()
    probed["calls"].clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert kernel_probe.qmv_variant(mx.bfloat16, 4, 64) == "fma"
    assert [type(w.message) for w in caught] == [DamagedFileWarning]
    assert str(path) in str(caught[0].message) and reason in str(caught[0].message)
    assert probed["calls"] == [("qmv_rows", "mul-add"), ("qmv_rows", "fma")]  # probed anew
    assert list(path.parent.glob(f"{path.name}.damaged-*"))
    assert json.loads(path.read_text())["verdicts"][key]["variant"] == "fma"


def test_no_exact_variant_is_stored_and_warned_in_each_process(probed):
    probed["exact"] = set()
    with pytest.warns(UserWarning, match="no variant reproduces"):
        assert kernel_probe.qmv_variant(mx.bfloat16, 4, 64) is None
    assert len(probed["calls"]) == 3  # every variant tried
    verdicts.forget()
    kernel_probe._warned.clear()  # a new process warns again, naming the stored verdict
    with pytest.warns(UserWarning, match="the verdict stored in"):
        assert kernel_probe.qmv_variant(mx.bfloat16, 4, 64) is None
    assert len(probed["calls"]) == 3


def test_a_kernel_that_fails_is_not_stored(probed):
    probed["broken"] = {"mul-add"}
    with pytest.warns(UserWarning, match="compilation failed"):
        assert kernel_probe.qmv_variant(mx.bfloat16, 4, 64) is None
    assert not verdicts.store_path().exists()
    assert kernel_probe.qmv_variant(mx.bfloat16, 4, 64) is None and len(probed["calls"]) == 1  # kept in memory
    verdicts.forget()
    probed["broken"] = set()
    assert kernel_probe.qmv_variant(mx.bfloat16, 4, 64) == "mul-add"  # the next process probes again


def test_off_cuda_nothing_is_probed_or_stored(probed, monkeypatch):
    monkeypatch.setattr(kernel_probe, "cuda_available", lambda: False)
    assert _variants() == (None, None, None)
    assert probed["calls"] == [] and not verdicts.store_path().exists()


def test_another_driver_is_probed_again(probed, tmp_path, monkeypatch):
    version = tmp_path / "version"
    version.write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15\nGCC version: 12\n")
    monkeypatch.setattr(verdicts, "DRIVER_VERSION", version)
    assert verdicts.driver_version().endswith("550.54.15")
    kernel_probe.qmv_variant(mx.bfloat16, 4, 64)
    verdicts.forget()
    version.write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.86.10\n")
    kernel_probe.qmv_variant(mx.bfloat16, 4, 64)
    assert len(probed["calls"]) == 2
    monkeypatch.setattr(verdicts, "DRIVER_VERSION", tmp_path / "absent")
    assert verdicts.driver_version() == ""


def test_on_cuda_exact_calibrations_are_keyed_by_the_kernels_source(monkeypatch):
    from conftest import build_tiny

    from specbench import kernels
    from specbench.exact import calibration as exact_calibration

    model = build_tiny("qwen3")
    monkeypatch.setattr(exact_calibration, "_keys", {})
    cpu_key = exact_calibration.calibration_key(model)
    monkeypatch.setattr(kernels, "cuda_available", lambda: True)
    monkeypatch.setattr(exact_calibration, "_keys", {})
    cuda_key = exact_calibration.calibration_key(model)
    monkeypatch.setattr(kernels, "source_digest", lambda kernel=None: "another source")
    monkeypatch.setattr(exact_calibration, "_keys", {})
    assert len({cpu_key, cuda_key, exact_calibration.calibration_key(model)}) == 3
