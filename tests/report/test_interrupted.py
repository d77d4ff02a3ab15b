"""A report stopped by a signal, or unable to record its result, says so in the notebook's status and the
index at once; the next run resumes from it."""

from __future__ import annotations

import errno
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from specbench.report import progress
from specbench.report import runner as report
from specbench.report.progress import Interrupted


def _notebook(path: Path, body: str) -> None:
    cell = new_code_cell('model = "m"\nmax_tokens = 12\npairs = 2\noutput_dir = ""\nprogress = True')
    cell.metadata["tags"] = ["parameters"]
    kernel = {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}}
    nbformat.write(new_notebook(cells=[cell, new_code_cell(body)], metadata=kernel), str(path))


def test_a_signal_marks_the_notebook_interrupted_and_the_next_run_resumes(tmp_path):
    notebooks = tmp_path / "nb"
    notebooks.mkdir()
    marker = tmp_path / "stopped-once"
    _notebook(
        notebooks / "quickstart.ipynb",
        f"import os, signal, time\nfrom pathlib import Path\nmarker = Path({str(marker)!r})\n"
        "if not marker.exists():\n    marker.write_text('')\n    os.kill(os.getppid(), signal.SIGTERM)\n"
        "    time.sleep(30)",
    )
    out = tmp_path / "report"
    kwargs = dict(only=["quickstart"], notebooks=notebooks, progress=False)
    with pytest.raises(Interrupted, match="SIGTERM"):
        report.run_report("quick", out, **kwargs)
    status = report.read_status(out, "quickstart")
    assert status["status"] == "interrupted" and "SIGTERM" in status["error"]
    assert 'class="interrupted">interrupted<' in (out / "index.html").read_text()
    assert report.run_report("quick", out, **kwargs).results[0].status == "done"
    assert report.read_status(out, "quickstart")["status"] == "done"


def test_a_result_that_cannot_be_recorded_marks_the_notebook_failed(tmp_path, monkeypatch, capsys):
    notebooks = tmp_path / "nb"
    notebooks.mkdir()
    _notebook(notebooks / "quickstart.ipynb", "pass")
    out = tmp_path / "report"
    write_status = report.write_status

    def full_disk(out_, name, status):
        if status["status"] == "done":
            raise OSError(errno.ENOSPC, "No space left on device")
        return write_status(out_, name, status)

    monkeypatch.setattr(report, "write_status", full_disk)
    with pytest.raises(OSError, match="No space left"):
        report.run_report("quick", out, only=["quickstart"], notebooks=notebooks, progress=False)
    status = report.read_status(out, "quickstart")
    assert status["status"] == "failed" and "No space left" in status["error"]
    assert 'class="failed"' in (out / "index.html").read_text()
    assert "the next run of this report resumes here" in capsys.readouterr().err


def test_a_cell_that_stops_answering_is_stopped_and_its_notebook_run_once_more(tmp_path, monkeypatch, capsys):
    notebooks = tmp_path / "nb"
    notebooks.mkdir()
    marker = tmp_path / "hung-once"
    _notebook(
        notebooks / "quickstart.ipynb",
        f"import time\nfrom pathlib import Path\nmarker = Path({str(marker)!r})\n"
        "if not marker.exists():\n    marker.write_text('')\n    time.sleep(120)",
    )
    assert progress.cell_timeout(None) == progress.MIN_CELL_TIMEOUT_S and progress.cell_timeout(100) == 1000
    monkeypatch.setattr(report, "cell_timeout", lambda expected_s: 4)
    out = tmp_path / "report"
    result = report.run_report("quick", out, only=["quickstart"], notebooks=notebooks, progress=True)
    assert result.results[0].status == "done" and result.results[0].seconds < 60
    assert "running it once more in a new kernel" in capsys.readouterr().err
