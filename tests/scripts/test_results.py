"""scripts/results.py: RESULTS.md and the README's block from the result files, a line's status from git history
(fresh, stale, unknown commit, a commit the clone lacks), the check mode's rule, and the A/A arm's verdict."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from scripts import result_lines as results
from scripts import results as script
from scripts.result_claims import CLAIMS
from scripts.result_lines import BEGIN, END, AACheck, Claim, Csv, Json, Text


def git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, check=True).stdout.strip()


@pytest.fixture
def repo(tmp_path) -> Path:
    """A git repository with code under specbench/core, a README with the results block, and no results yet."""
    root = tmp_path / "repo"
    (root / "specbench" / "core").mkdir(parents=True)
    (root / "reports").mkdir()
    (root / "specbench" / "core" / "engine.py").write_text("x = 1\n")
    (root / "README.md").write_text(f"# p\n\n## Results\n\n{BEGIN}\n{END}\n\nend\n")
    git(root, "init", "-q")
    git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "start", "--allow-empty")
    git(root, "add", "-A")
    git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "code")
    return root


def commit_all(root: Path, message: str) -> str:
    git(root, "add", "-A")
    git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", message)
    return git(root, "rev-parse", "HEAD")


def result(root: Path, name: str, commit: str, ratio: float = 1.5, aa: dict | None = None) -> None:
    body = {"provenance": {"commit": commit, "device": "gpu:X", "date": "2026-12-08T10:00:00+00:00"}}
    body["cell"] = {"ratio": ratio, "interval": [ratio - 0.1, ratio + 0.1], "ratios": [ratio] * 6}
    if aa is not None:
        body["a_a"] = aa
    (root / "reports" / name).write_text(json.dumps(body))


def claim(name: str, headline: str = "", **more) -> Claim:
    read = Json(("cell", "ratio"), interval=("cell", "interval"), n=("cell", "ratios"))
    return Claim(
        name, "GPU X", f"the {name} claim", "B / A tokens/s", name, read, fmt="{:.2f}x", headline=headline, **more
    )


def status(root: Path, c: Claim) -> str:
    return results.read_line(c, root).status


def test_a_line_is_current_until_the_code_it_measures_changes(repo):
    head = git(repo, "rev-parse", "HEAD")
    result(repo, "a.json", head)
    assert status(repo, claim("a.json")) == "current"
    commit_all(repo, "the result committed")  # committing results (or RESULTS.md) does not age a line
    assert status(repo, claim("a.json")) == "current"
    (repo / "specbench" / "core" / "engine.py").write_text("x = 2\n")
    assert status(repo, claim("a.json")) == "stale: the code it measures has uncommitted changes"
    changed = commit_all(repo, "engine changed")
    assert status(repo, claim("a.json")) == f"stale: the code it measures changed since (first in {changed[:7]})"
    # a claim measuring other code only is not aged by it
    assert status(repo, claim("a.json", measures=("specbench/drafters",))) == "current"


def test_unknown_dirty_and_foreign_commits_are_stale(repo):
    head = git(repo, "rev-parse", "HEAD")
    for name, commit, said in (
        ("u.json", "unknown", "stale: the file names no commit (provenance unknown)"),
        ("d.json", f"{head}-dirty", "stale: made from a tree with uncommitted changes"),
        ("f.json", "f" * 40, "stale: commit not in this history"),
    ):
        result(repo, name, commit)
        assert status(repo, claim(name)) == said
    cell = {"ratio": 2.0, "interval": [1.9, 2.1], "ratios": [2.0] * 6}
    old = {"device": "gpu:Y", "mlx": "0.1", "specbench": "unknown", "cell": cell}  # a file from before provenance
    (repo / "reports" / "old.json").write_text(json.dumps(old))
    line = results.read_line(claim("old.json"), repo)
    assert line.provenance.device == "gpu:Y" and line.status.startswith("stale: the file names no commit")


def test_missing_overwritten_empty_and_failed_runs_are_marked(repo):
    head = git(repo, "rev-parse", "HEAD")
    assert status(repo, claim("none.json")) == "missing: none.json is absent"
    result(repo, "a.json", head)
    assert status(repo, claim("a.json", overwritten="a later run")) == "unsupported: the file now holds a later run"
    (repo / "reports" / "log.txt").write_text("category=qa settings={} identical=False\n")
    zero = Claim("z", "GPU X", "z", "runs equal", "log.txt", Text(r"identical=True$", runs=r"^category=.* mtp=1"))
    assert status(repo, zero) == "unsupported: a result over zero runs"
    aa = Json(("a_a", "ratio"), ("a_a", "interval"), n=("a_a", "n"))
    failing = AACheck.of_ratios([0.90, 0.91, 0.92, 0.90, 0.89, 0.91]).as_record()
    result(repo, "f.json", head, aa=failing)
    assert status(repo, claim("f.json", aa=aa)).startswith("failed: A/A 0.905 [")
    result(repo, "p.json", head, aa=AACheck.of_ratios([0.98, 1.02, 1.0, 0.99, 1.01, 1.0]).as_record())
    assert status(repo, claim("p.json", aa=aa)) == "current"
    result(repo, "n.json", head)  # a current run without an A/A arm failed the protocol
    assert status(repo, claim("n.json", aa=aa)) == "failed: the run has no A/A arm"
    result(repo, "o.json", "unknown")  # an older one is stale first
    assert status(repo, claim("o.json", aa=aa)).startswith("stale")


def test_csv_and_text_readers(repo):
    (repo / "reports" / "p.csv").write_text("model,what,n,ratio,low,high\nm,A/A,6,1.0,0.9,1.1\nm,B,12,1.2,1.1,1.3\n")
    reading = Csv({"model": "m", "what": "B"}, "ratio", "low", "high", "n").read(
        (repo / "reports" / "p.csv").read_text()
    )
    assert (reading.value, reading.low, reading.high, reading.n) == (1.2, 1.1, 1.3, 12)
    assert Text(r"exact\s+(?P<value>\d+)/(?P<n>\d+)").read("m  exact  19/20\n").n == 20
    assert Json(("equal",)).read('{"equal": "19/20"}').value == 19.0
    with pytest.raises(results.ClaimError, match="2 rows match"):
        Csv({"model": "m"}, "ratio").read((repo / "reports" / "p.csv").read_text())


def test_check_mode_passes_on_its_own_output_and_names_a_difference(repo, capsys):
    head = git(repo, "rev-parse", "HEAD")
    result(repo, "a.json", head)
    claims = [claim("a.json", headline="X, B over A")]
    assert script.main([], root=repo, claims=claims) == 0
    text = (repo / "reports" / "RESULTS.md").read_text()
    assert "| a.json | the a.json claim | B / A tokens/s | 1.50x | 1.40x–1.60x | 6 | gpu:X |" in text
    assert text.rstrip().endswith("| current |")
    assert "- X, B over A: 1.50x [1.40x–1.60x], n = 6 (current)" in (repo / "README.md").read_text()
    assert script.main(["--check"], root=repo, claims=claims) == 0
    commit_all(repo, "results")
    assert script.main(["--check"], root=repo, claims=claims) == 0  # committing RESULTS.md changes nothing

    (repo / "reports" / "RESULTS.md").write_text(text.replace("1.50x |", "1.55x |"))  # edited by hand
    assert script.main(["--check"], root=repo, claims=claims) == 1
    assert "RESULTS.md:" in capsys.readouterr().err
    (repo / "reports" / "RESULTS.md").write_text(text)

    (repo / "specbench" / "core" / "engine.py").write_text("x = 3\n")
    commit_all(repo, "engine changed")  # RESULTS.md now claims a stale number current
    assert script.main(["--check"], root=repo, claims=claims) == 1
    assert "says 'current'" in capsys.readouterr().err
    assert script.main([], root=repo, claims=claims) == 0  # regenerated: marked stale
    assert "| stale: the code it measures changed since" in (repo / "reports" / "RESULTS.md").read_text()
    commit_all(repo, "results regenerated")
    (repo / "specbench" / "core" / "engine.py").write_text("x = 4\n")
    commit_all(repo, "engine changed again")  # a stale line stays acceptable, whatever its reason now
    assert script.main(["--check"], root=repo, claims=claims) == 0


def test_the_project_claims_read_their_files():
    """Every declared claim names a file under reports/ and reads it (or says why it no longer can)."""
    keys = [c.key for c in CLAIMS]
    assert len(keys) == len(set(keys))
    lines = [results.read_line(c, script.ROOT) for c in CLAIMS]
    # a claim registered before its run (pending) is missing until the run's files land; no other claim may be
    assert not [line.claim.key for line in lines if line.status.startswith("missing") and not line.claim.pending]
    assert not [c.key for c in CLAIMS if c.pending and (script.ROOT / "reports" / c.file).exists()]
    assert not [
        line.claim.key
        for line in lines
        if line.reading is None and not line.status.startswith(("unsupported", "missing"))
    ]


def test_aa_check_passes_only_an_interval_that_covers_one():
    assert AACheck.of_ratios([0.97, 1.03, 1.0, 0.99, 1.02, 1.01]).passed
    slow = AACheck.of_ratios([0.90, 0.92, 0.91, 0.93, 0.90, 0.92])
    assert not slow.passed and slow.verdict().startswith("failed:") and "excludes 1.0" in slow.verdict()
    few = AACheck.of_ratios([1.0, 1.0, 1.0])
    assert not few.passed and few.as_record()["interval"] is None and "no interval" in few.verdict()
    assert not AACheck(1.0, 0.9, 1.1, 3).passed  # an interval over fewer than MIN_UNITS repeats counts as none
    with pytest.raises(ValueError, match="at least one"):
        AACheck.of_ratios([])
