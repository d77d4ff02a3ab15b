"""The GPU scripts' CPU smoke runs (--quick): device time is scarce, so a script that breaks
should break here first.

The runs share one SPECBENCH_HOME (``script_home``), apart from the user's: the embedded model is linked in as the
test session's home links it, and what one run calibrates the later runs find stored, as on a GPU machine where the
scripts run one after another. Each run is a script's ``__main__`` run in this process (a subprocess would add about
2 s of start-up per run), but the run stopped by a signal, which needs a process of its own."""

from __future__ import annotations

import importlib
import io
import json
import os
import runpy
import signal
import subprocess
import sys
from contextlib import redirect_stdout
from pathlib import Path
from unittest import mock

import pytest
from conftest import SESSION_HOME

from specbench.common.identity import result_data
from specbench.cost.batch import BatchProfile

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def script_home(tmp_path_factory) -> Path:
    """A SPECBENCH_HOME for this module's script runs, with the session's embedded models linked in (not converted
    again by each run); calibrations stored by one run serve the later ones."""
    home = tmp_path_factory.mktemp("script-home")
    (home / "models").mkdir()
    for model in (SESSION_HOME / "models").glob("*"):
        (home / "models" / model.name).symlink_to(model.resolve(), target_is_directory=True)
    return home


def script_module(name: str) -> str:
    """The module of scripts/gpu/``name``, as ``python -m`` runs it from the repository's root."""
    return f"scripts.gpu.{name.removesuffix('.py')}"


def run_script(name: str, tmp_path: Path, home: Path, *args: str, quick: bool = True) -> str:
    """stdout of scripts/gpu/``name`` run with --quick (unless ``quick`` is False) and ``args``, writing into
    ``tmp_path`` ($OUT): run as ``python -m`` runs it from the repository's root, in this process, whose working
    folder, environment, arguments and signal handlers are put back afterwards. A non-zero exit fails the test."""
    script = script_module(name)
    stdout, folder = io.StringIO(), os.getcwd()
    handlers = {number: signal.getsignal(number) for number in (signal.SIGINT, signal.SIGTERM)}
    env = {"OUT": str(tmp_path), "SPECBENCH_HOME": str(home)}
    argv = [script, *(["--quick"] if quick else []), *args]
    with mock.patch.dict(os.environ, env), mock.patch.object(sys, "argv", argv), redirect_stdout(stdout):
        try:
            os.chdir(ROOT)
            sys.modules.pop(script, None)  # imported by another test: runpy runs a fresh copy as __main__
            runpy.run_module(script, run_name="__main__", alter_sys=True)
        except SystemExit as stopped:
            assert stopped.code in (0, None), f"exit status {stopped.code}: {stdout.getvalue()[-2000:]}"
        finally:
            os.chdir(folder)
            for number, handler in handlers.items():
                signal.signal(number, handler)
    return stdout.getvalue()


def test_exactness_script(tmp_path, script_home):
    out = run_script("exactness.py", tmp_path, script_home, "--models", "qwen3-8b-tiny,qwen3-30b-a3b-tiny")
    assert "bit-identical to plain greedy on every prompt: True" in out
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert {r["model"] for r in summary["exactness"]} == {"qwen3-8b-tiny", "qwen3-30b-a3b-tiny"}
    named = summary["provenance"]  # every result file names the code and machine that made it
    assert named["commit"] != "unknown" and named["device"].startswith("cpu:") and "exactness" in named["command"]
    assert {r["mode"] for r in summary["exactness"]} == {"exact", "fast", "exact-tree", "fast-tree"}
    assert (tmp_path / "exactness.csv").exists() and (tmp_path / "cost.csv").exists()


def test_batch_script_exact_phase(tmp_path, script_home):
    out = run_script("batch.py", tmp_path, script_home, "--exact", "--budget", "300")
    result = json.loads((tmp_path / "batch_exact.json").read_text())
    assert result["provenance"]["commit"] != "unknown" and "--exact" in result["provenance"]["command"]
    rows = result["rows"]
    assert {(r["model"].split(":")[1], r["batch_size"]) for r in rows} == {
        (shape, b) for shape in ("qwen3-8b-tiny-fp32", "qwen3-30b-a3b-tiny-fp32") for b in (1, 4)
    }
    assert all(r["all_exact"] and r["exact_equal"] == r["batch_size"] for r in rows)  # every request, every repeat
    assert all(r["repeats"] == 6 and r["interval"] is not None and "verdict" in r["a_a"] for r in rows)
    assert "requests equal mlx-lm greedy" in out and (tmp_path / "batch_exact.csv").exists()
    assert not (tmp_path / "batch_summary.json").exists()  # only the exact phase ran


def test_exact_diagnose_script(tmp_path, script_home):
    out = run_script("exact_diagnose.py", tmp_path, script_home)
    report = json.loads((tmp_path / "diagnose.json").read_text())
    assert len(report["crossing"]) == 4 and all(c["first_mismatch"] is None for c in report["crossing"])
    assert all(c["copy_equal"] and c["after_other_calls_equal"] for c in report["copied_cache"])
    assert "lockstep" in out


def test_cost_script_and_replot(tmp_path, script_home):
    out = run_script("cost.py", tmp_path, script_home, "--models", "qwen3-8b-tiny", "--hybrids", "")
    assert "prediction error of the seconds per token" in out
    for name in ("profiles.json", "grid.csv", "costs.png", "break_even.png", "measured.png"):
        assert (tmp_path / name).exists(), name
    a_a = json.loads((tmp_path / "a_a.json").read_text())["a_a"]  # the plain forward against itself, per model
    assert len(a_a) == 1 and all(r["n"] == 6 and r["interval"] is not None for r in a_a.values())
    assert all(f"A/A {r['verdict']}" in out for r in a_a.values())
    (tmp_path / "measured.png").unlink()
    run_script("cost.py", tmp_path, script_home, "--replot", str(tmp_path), quick=False)
    assert (tmp_path / "measured.png").exists()


def test_traces_script(tmp_path, script_home):
    out = run_script("traces.py", tmp_path, script_home, "--drafters", "lookup,suffix")
    assert "outputs identical: True" in out
    assert (tmp_path / "traces_summary.csv").exists()


def test_default_policy_script(tmp_path, script_home):
    out = run_script(
        "default_policy.py", tmp_path, script_home, "--shapes", "qwen3-8b-tiny"
    )  # one shape: the MoE's is alike
    assert "in plain steps" in out and "A/A, in plain steps" in out
    assert "outputs equal to plain greedy on every checked run: True" in out
    summary = json.loads((tmp_path / "default_policy.json").read_text())
    cells = summary["grid"] + summary["embedded"]
    assert {"in_steps", "steps_low", "steps_high", "verdict", "verdict_in_steps"} <= set(cells[0])
    assert {"in_mean_steps", "mean_steps_low", "mean_steps_high"} <= set(cells[0]) and "A/A, in mean steps" in out
    # every run records both speeds, shapes and the embedded model alike
    assert all({"plain_mean_ms", "auto_mean_ms"} <= set(r) for r in summary["runs"])
    assert any(r["what"] == "plain a/a" for r in summary["grid"])
    # each model's A/A arm judged (``result_lines.AACheck``): the shape's and the embedded model's
    assert len(summary["a_a"]) == 2 and all({"passed", "verdict"} <= set(r) for r in summary["a_a"].values())
    assert "qwen3-8b-tiny: " + summary["a_a"]["qwen3-8b-tiny"]["verdict"] in out
    stages = next(iter(summary["setup"].values()))  # where a shape's set-up went, stage by stage
    assert list(stages)[:3] == ["build", "calibration", "profiles"] and all(s >= 0 for s in stages.values())
    assert "set-up by stage: build" in out


def test_default_policy_script_stopped_keeps_what_finished(tmp_path, script_home):
    """SIGTERM (what `timeout` sends) mid-run: the repeats that finished are saved and summarized."""
    env = {**os.environ, "OUT": str(tmp_path), "SPECBENCH_HOME": str(script_home)}
    args = ["--quick", "--shapes", "qwen3-8b-tiny", "--no-embedded"]
    with subprocess.Popen(
        [sys.executable, "-m", script_module("default_policy"), *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    ) as run:
        for line in run.stdout:
            if line.startswith("  repeat 1/"):  # the first repeat is saved: stop the run
                run.send_signal(signal.SIGTERM)
                break
        out = line + run.stdout.read()
        assert run.wait(timeout=300) == 0, out[-2000:]
    assert "stopped by SIGTERM" in out
    saved = json.loads((tmp_path / "default_policy.json").read_text())
    assert {r["repeat"] for r in saved["runs"]} == {0} and saved["grid"]
    assert "stopped by SIGTERM" in saved["reduced"][-1]


def test_default_policy_embedded_runs_split_over_calls_are_summarized_together(tmp_path, script_home):
    """The embedded phase by category at a fixed length, in two calls, then one summary of both."""
    for category in ("qa", "rag"):
        args = ["--shapes", "", "--categories", category, "--traces", "", "--embedded-tokens", "12"]
        run_script("default_policy.py", tmp_path, script_home, *args, "--out", str(tmp_path / category))
        runs = json.loads((tmp_path / category / "default_policy.json").read_text())["runs"]
        assert {r["what"] for r in runs} == {f"category {category}"} and {r["tokens"] for r in runs} == {12}
    out = run_script(
        "default_policy.py", tmp_path, script_home, "--resummarize", str(tmp_path / "qa"), str(tmp_path / "rag")
    )
    assert "category qa" in out and "category rag" in out and "verdicts of 4 cells" in out


def test_default_policy_bad_options_fail_before_model_work(tmp_path, monkeypatch, capsys):
    """Each bad option ends the script's ``main`` with argparse's exit status 2 and a message naming what is
    wrong, before any model work (run in this process: a subprocess per case would only add its start-up)."""
    monkeypatch.syspath_prepend(str(ROOT))
    default_policy = importlib.import_module("scripts.gpu.default_policy")
    for args, named in (
        (["--categories", "qa,poetry"], "translation"),  # names the bundled categories
        (["--traces", "nope"], "coding-agent"),
        (["--resummarize", str(tmp_path)], "default_policy.json"),
        (["--modes", "exact,greedy"], "exact, fast"),
        (["--acceptances", "0.5,1.5"], "[0, 1]"),
        (["--repeats", "1"], "at least 2"),
    ):
        monkeypatch.setattr(sys, "argv", ["default_policy.py", *args])
        with pytest.raises(SystemExit) as stopped:  # any other exception (a traceback) fails the test
            default_policy.main()
        assert stopped.value.code == 2 and named in capsys.readouterr().err


def test_default_policy_sizes_shrink_tokens_before_repeats():
    from scripts.gpu.default_policy_phases import fitted_sizes

    # 0.01 s a token, 10 runs a repeat: 8 repeats x 256 tokens need 204.8 s
    assert fitted_sizes(300.0, 0.01, 10, (256, 128), (8, 6)) == (256, 8)
    assert fitted_sizes(120.0, 0.01, 10, (256, 128), (8, 6)) == (150, 8)  # fewer tokens first
    assert fitted_sizes(80.0, 0.01, 10, (256, 128), (8, 6)) == (133, 6)  # then fewer repeats
    assert fitted_sizes(1.0, 0.01, 10, (256, 128), (8, 6)) == (128, 6)  # the least of both when nothing fits


def test_default_policy_runs_only_the_cells_asked_for(tmp_path, script_home):
    """A rerun of chosen cells with more repeats: only those cells (and the A/A cell) are timed."""
    args = ["--shapes", "qwen3-8b-tiny", "--no-embedded", "--modes", "fast", "--acceptances", "0.5", "--repeats", "3"]
    run_script("default_policy.py", tmp_path, script_home, *args)
    runs = json.loads((tmp_path / "default_policy.json").read_text())["runs"]
    assert {r["what"] for r in runs} == {"plain a/a", "fast a=0.5"}
    assert {r["repeat"] for r in runs} == {0, 1, 2}


def test_exact_speed_script(tmp_path, script_home):
    out = run_script("exact_speed.py", tmp_path, script_home)
    result = json.loads((tmp_path / "exact_speed.json").read_text())
    rows = result["shapes"]["qwen3-8b-tiny"]["rows"]
    assert set(rows) == {"plain", "mlx-lm", "exact k=4", "fast k=4", "plain (A/A)"} | {
        f"auto exact a={a}" for a in ("1", "0.3", "0.7")
    }
    assert all(rows[name]["verdict"] == "too few repeats" for name in rows if name.startswith("auto"))
    # the A/A arm: 2 repeats give no interval, so the run is reported as failed, in the file and on stdout
    a_a = result["shapes"]["qwen3-8b-tiny"]["a_a"]
    assert a_a["n"] == 2 and a_a["interval"] is None and not a_a["passed"] and "reported as failed" in out
    assert all(rows[name]["equals_plain"] for name in rows if "exact" in name)
    assert rows["exact k=4"]["verifies"][0] > 0 and "exact k=4 / fast k=4" in out
    versus_fast = result["shapes"]["qwen3-8b-tiny"]["exact_over_fast"]
    assert len(versus_fast["ratios"]) == 2 and versus_fast["interval"] is None and versus_fast["ratio"] > 0
    versus = result["shapes"]["qwen3-8b-tiny"]["plain_over_mlx_lm"]
    assert versus["repeats"] == 2 and versus["verdict"] == "too few repeats" and "plain / mlx-lm" in out


def test_plain_against_mlx_lm_is_decided_by_the_interval():
    from scripts.gpu.exact_speed import plain_over_mlx_lm

    def verdict(tokens_per_s_ratios):
        return plain_over_mlx_lm([1 / r for r in tokens_per_s_ratios])

    faster = verdict([1.2, 1.22, 1.19, 1.21, 1.18, 1.2, 1.23, 1.2])
    assert faster["verdict"] == "faster" and faster["aim_met"] and abs(faster["ratio"] - 1.2) < 1e-9
    assert verdict([1.05, 1.06, 1.04, 1.05, 1.07, 1.05])["aim_met"] is False
    assert verdict([0.9, 1.1, 0.95, 1.08, 1.0, 0.97, 1.03, 0.92])["verdict"] == "inconclusive"
    assert verdict([0.8, 0.82, 0.79, 0.81, 0.8, 0.83])["verdict"] == "slower"


def test_auto_verdict_is_decided_by_the_interval():
    from scripts.gpu.exact_speed import auto_verdict

    assert auto_verdict((1.02, 1.3)) == "pays" and auto_verdict((0.8, 0.99)) == "loses"
    assert auto_verdict((0.975, 1.04)) == "no loss beyond 3 %" and auto_verdict((0.9, 1.1)) == "inconclusive"
    assert auto_verdict(None) == "too few repeats"


def test_components_script(tmp_path, script_home):
    run_script("components.py", tmp_path, script_home)
    folder = tmp_path / "components"
    summary = json.loads((folder / "summary.json").read_text())
    assert set(summary["components"]) == {"qwen3-8b-tiny", "qwen3-30b-a3b-tiny", "qwen3.5-9b-tiny"}
    assert set(summary["batch_mean_abs_error"]) == {"qwen3-8b-tiny", "qwen3-30b-a3b-tiny"}
    # an A/A arm per shape built: its plain forward against itself, 6 pairs, an interval, passed or failed
    assert set(summary["a_a"]) >= set(summary["components"])
    assert all(
        r["n"] == 6 and r["interval"] is not None and isinstance(r["passed"], bool) for r in summary["a_a"].values()
    )
    spread = summary["batch_plain_spread"]  # the plain runs' own noise per batch size, beside the residuals
    assert all(set(spread[s]) == set(summary["batch_mean_abs_error"][s]) - {"all"} for s in spread)
    assert all(v >= 0 for by_b in spread.values() for v in by_b.values())
    rows = result_data(json.loads((folder / "components.json").read_text()))
    moe = {r["part"] for r in rows if r["shape"] == "qwen3-30b-a3b-tiny" and r["seconds"] > 0}
    assert "experts" in moe
    lengths = json.loads((folder / "lengths.json").read_text())
    assert all(len(v["by_length"]) == 3 for k, v in lengths.items() if k != "provenance")
    batch = json.loads((folder / "batch.json").read_text())
    assert all("residual" in r and "predicted_from_log" in r for r in batch["rows"])
    profiles = {shape: BatchProfile.from_dict(p) for shape, p in batch["profiles"].items()}
    assert set(profiles) == {"qwen3-8b-tiny", "qwen3-30b-a3b-tiny"}  # every shape's profile kept, not the last
    assert all(p.overhead_s and p.c(2, 1) > 0 for p in profiles.values())


def test_kernels_script(tmp_path, script_home):
    out = run_script("kernels.py", tmp_path, script_home)
    result = json.loads((tmp_path / "qmv_schedules.json").read_text())
    assert [r["layer"] for r in result["layers"]] == ["small", "residue"]
    assert all(r["mlx_1_us"] > 0 and r["mlx_fast_9_eval_us"] > 0 for r in result["layers"])
    a_a = result["a_a"]  # MLX's one-row product timed against itself, 6 pairs: an interval, passed or failed
    assert a_a["n"] == 6 and a_a["interval"] is not None and f"A/A {a_a['verdict']}" in out
    assert ("reported as failed" in out) != a_a["passed"]
    if result["dequant"] is None:  # no CUDA: MLX's products only
        assert "CUDA kernels: False" in out and not result["launches"]
    else:
        assert all(r["identical_loop"] and r["identical_prefetch"] for r in result["layers"])


def test_one_row_diagnose_script(tmp_path, script_home):
    out = run_script("one_row_diagnose.py", tmp_path, script_home, "--width", "3")
    report = json.loads((tmp_path / "one_row_diagnose.json").read_text())
    assert report["plain_logits_identical"] and all(report["plain_logits_identical"])
    assert report["calibrated_inside"]["level"] == report["calibrated_outside"]["level"] != "serial"
    assert "on_first_use" in out and "elapsed_s" in report


def test_long_context_script(tmp_path, script_home):
    out = run_script("long_context.py", tmp_path, script_home, "--audit", "1", "--prefill-step", "256")
    assert "exact output equal to mlx-lm's greedy: 4/4" in out
    report = json.loads((tmp_path / "long_context.json").read_text())
    assert {(r["shape"], r["length"]) for r in report["rows"]} == {
        (s, n) for s in ("qwen3-8b-tiny", "qwen3-30b-a3b-tiny") for n in (300, 600)
    }
    assert report["provenance"]["commit"] != "unknown"
    assert all(r["peak_mb"] > 0 for r in report["rows"])  # each mode's peak device memory, weights included
    assert report["config"]["prefill_step"] == 256  # prompts of 300 and 600 tokens prefilled in chunks, both sides
    # the summary: exact rows equal to mlx-lm's of all exact rows, and fast likewise (fast may differ)
    assert report["exact_equal"] == "4/4" and report["fast_equal"].endswith("/4")
    assert f"fast output equal to mlx-lm's greedy: {report['fast_equal']}" in out
    # --audit 1: every exact verification compared with serial steps; on the CPU they are bit-identical
    audits = [r["audit"] for r in report["rows"] if r["mode"] == "exact"]
    assert len(audits) == 4 and all(a["audited"] == a["verifications"] > 0 and a["mismatches"] == 0 for a in audits)
    audited = sum(a["audited"] for a in audits)
    assert report["audit"] == f"0 mismatches in {audited} audited verifications" in out
    assert report["audit_mismatches"] == f"0/{audited}"


def test_long_context_keeps_a_length_that_ran_out_of_memory_and_goes_on(tmp_path, monkeypatch):
    from scripts.gpu import long_context

    def check_length(model, length, *args, **kwargs):
        if length == 600:  # as mlx-lm's prefill of a 32k prompt on the MoE shape did on an H100
            raise RuntimeError("cudaMallocAsync(&data, size, stream) failed: out of memory")
        exact = {"equal": True, "first_divergence": None, "verifies": 2, "accepted": 4, "seconds": 0.1, "peak_mb": 1}
        return [{"length": length, "mode": "mlx-lm", "seconds": 0.1}, {"length": length, "mode": "exact", **exact}]

    monkeypatch.setattr(long_context, "check_length", check_length)
    monkeypatch.setattr(sys, "argv", ["long_context", "--quick", "--out", str(tmp_path)])
    assert long_context.main() == 1  # nothing differed, but a length went unchecked
    report = json.loads((tmp_path / "long_context.json").read_text())
    assert {(r["shape"], r["length"]) for r in report["rows"]} == {("qwen3-8b-tiny", 300), ("qwen3-30b-a3b-tiny", 300)}
    assert [(r["shape"], r["length"]) for r in report["unchecked"]] == [
        ("qwen3-8b-tiny", 600),
        ("qwen3-30b-a3b-tiny", 600),
    ]
    assert all("out of memory" in r["error"] for r in report["unchecked"]) and report["exact_equal"] == "2/2"


def test_bench_script(tmp_path, script_home):
    out = run_script("bench.py", tmp_path, script_home, "--budget", "26")  # the engine check; no time left for prompts
    engine = json.loads((tmp_path / "engine_speed.json").read_text())
    # the engine's A/A arm (mlx-lm against itself): 6 alternating rounds even where the real arm has 1, so an interval
    a_a = engine["a_a"]
    assert a_a["n"] >= 6 and a_a["interval"] is not None and {"ratio", "passed", "verdict"} <= set(a_a)
    assert f"A/A {a_a['verdict']}" in out and ("reported as failed" in out) != a_a["passed"]
    assert "time budget reached: 2 questions not run" in out


def test_kernel_verify_script(tmp_path, script_home):
    out = run_script("kernel_verify.py", tmp_path, script_home)
    result = json.loads((tmp_path / "kernel_verify-qwen3-8b-tiny-0bit.json").read_text())
    assert result["chosen"] and set(result["seconds"]) == {"plain_step", "fast", "exact", "exact_without_kernel"}
    a_a = result["a_a"]  # the fast level timed against itself, 6 pairs: an interval, passed or failed
    assert a_a["n"] == 6 and a_a["interval"] is not None and f"A/A {a_a['verdict']}" in out
    assert ("reported as failed" in out) != a_a["passed"]


def test_kernel_verify_width_profile(tmp_path, script_home):
    out = run_script("kernel_verify.py", tmp_path, script_home, "--widths", "1-3,5")
    result = json.loads((tmp_path / "kernel_widths-qwen3-8b-tiny-0bit.json").read_text())
    rows = result["widths"]
    assert [r["width"] for r in rows] == [1, 2, 3, 5] and rows[0]["c_fast"] == 1.0 and rows[0]["level"] == "none"
    peak = result["peak_bytes_per_s"]
    for r in rows:  # bytes read over seconds, against the measured peak: the two columns agree
        assert r["exact_peak_fraction"] == pytest.approx(r["bytes"] / (r["exact_ms"] / 1e3) / peak)
        assert r["c_exact"] == pytest.approx(r["exact_ms"] / rows[0]["fast_ms"]) and r["level"]
    assert "per width at 32 cached tokens" in out and result["provenance"]["commit"] != "unknown"


def test_widths_are_parsed_from_ranges_and_lists():
    from scripts.gpu.kernel_verify import widths_of

    assert widths_of("1-4,9,16") == [1, 2, 3, 4, 9, 16] and widths_of("3,2-3") == [2, 3]
