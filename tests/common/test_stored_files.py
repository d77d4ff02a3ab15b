"""Stored files of every kind: two concurrent writers lose nothing; damaged files are detected on read,
moved aside with a warning naming them, and never used."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specbench.common.files import DamagedFileWarning
from specbench.common.identity import versions
from specbench.cost.profile import Profile, check_profile, load_profile, profile_path
from specbench.cost.trees import TreeCosts, _read_or_set_aside, check_tree_costs
from specbench.report.index import check_status, read_status

HERE = Path(__file__).resolve().parent
ROUNDS = 30


def test_two_concurrent_writers_of_every_kind_lose_nothing(tmp_path):
    env = {**os.environ, "SPECBENCH_HOME": str(tmp_path / "home")}
    report = tmp_path / "report"
    writers = [
        subprocess.Popen([sys.executable, str(HERE / "stored_writer.py"), who, str(ROUNDS), str(report)], env=env)
        for who in "ab"
    ]
    assert [w.wait(timeout=300) for w in writers] == [0, 0]
    home = tmp_path / "home"
    (profile,) = (home / "profiles").glob("m--*.json")
    stored = json.loads(profile.read_text())
    assert set(stored["costs"]) == {"fast", "exact"}
    assert set(stored["drafters"]) == {f"{w}{r}" for w in "ab" for r in range(ROUNDS)}
    (trees,) = (home / "profiles" / "trees").glob("*.json")
    assert json.loads(trees.read_text())["nodes"] == list(range(1, 2 * ROUNDS + 1))
    (calibration,) = (home / "exact").glob("key.json")
    assert sorted(map(int, json.loads(calibration.read_text())["widths"])) == list(range(2, 2 * ROUNDS + 2))
    page = (report / "index.html").read_text()
    names = [f"{w}{r}" for w in "ab" for r in range(ROUNDS)]
    assert all(f'id="{n}"' in page or f">{n}<" in page for n in names), page[:2000]
    assert set(names) <= set(json.loads((report / "report.json").read_text()))


# -- damaged files -----------------------------------------------------------------------------------------


def _profile() -> dict:
    return Profile(
        "m", "m", "cpu", {"mlx": "0"}, 0.01, {"fast": [1, 2, 4]}, {"fast": [1.0, 1.2, 1.9]}, {"fast": [0.01] * 3}
    ).to_dict()


def _trees() -> dict:
    return TreeCosts("m", "cpu", {"mlx": "0"}, "fast", 0.01, [1, 2, 4], [1.1] * 3, [1.0] * 3, [0.01] * 3, [0.01] * 3)


def _status() -> dict:
    return {"notebook": "nb", "status": "done", "seconds": 3.5, "parameters": {}, "outputs": ["nb.html"]}


DAMAGE = [
    ("zero costs", "profile", lambda d: d["costs"].update(fast=[0.0, 0.0, 0.0])),
    ("negative cost", "profile", lambda d: d["costs"]["fast"].__setitem__(1, -1.0)),
    ("NaN cost", "profile", lambda d: d["costs"]["fast"].__setitem__(0, math.nan)),
    ("widths out of order", "profile", lambda d: d["widths"].update(fast=[1, 4, 2])),
    ("no costs", "profile", lambda d: d.update(costs={}, widths={}, seconds={})),
    ("zero plain step", "profile", lambda d: d.update(plain_step_s=0)),
    ("NaN drafter cost", "profile", lambda d: d["drafters"].update(x={"d": math.nan})),
    ("no nodes", "trees", lambda d: d.update(nodes=[], tree=[], path=[], tree_s=[], path_s=[])),
    ("zero tree cost", "trees", lambda d: d["tree"].__setitem__(0, 0.0)),
    ("negative path cost", "trees", lambda d: d["path"].__setitem__(2, -2.0)),
    ("NaN seconds", "trees", lambda d: d["tree_s"].__setitem__(1, math.nan)),
    ("nodes out of order", "trees", lambda d: d.update(nodes=[4, 2, 1])),
    ("short curve", "trees", lambda d: d["path"].pop()),
    ("unknown status", "status", lambda d: d.update(status="finished")),
    ("negative run time", "status", lambda d: d.update(seconds=-1)),
    ("NaN run time", "status", lambda d: d.update(seconds=math.nan)),
    ("outputs not a list", "status", lambda d: d.update(outputs="nb.html")),
]


def _write(kind: str, root: Path, data) -> Path:
    path = {
        "profile": profile_path("m", "cpu", versions(), root),
        "trees": root / "trees.json",
        "status": root / "nb" / "status.json",
    }[kind]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data if isinstance(data, bytes) else json.dumps(data).encode())
    return path


def _read(kind: str, root: Path):
    if kind == "profile":
        return load_profile("m", "cpu", root)
    if kind == "trees":
        return _read_or_set_aside(root / "trees.json")
    return read_status(root, "nb")


def _good(kind: str) -> dict:
    data = {"profile": _profile, "trees": lambda: _trees().__dict__.copy(), "status": _status}[kind]()
    return json.loads(json.dumps(data))


@pytest.mark.parametrize("what, kind, damage", DAMAGE, ids=[d[0] for d in DAMAGE])
def test_damaged_files_are_moved_aside_with_a_warning_naming_them(tmp_path, what, kind, damage):
    data = _good(kind)
    damage(data)
    path = _write(kind, tmp_path, data)
    with pytest.warns(DamagedFileWarning, match=path.name):
        assert _read(kind, tmp_path) is None
    assert not path.exists() and list(path.parent.glob(f"{path.name}.damaged-*"))


@pytest.mark.parametrize("kind", ["profile", "trees", "status"])
def test_whole_files_are_read(tmp_path, kind):
    _write(kind, tmp_path, _good(kind))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _read(kind, tmp_path) is not None


_json = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 10**6) | st.floats() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=8,
)
_CHECKS = {"profile": check_profile, "trees": check_tree_costs, "status": check_status}


def _damaged(kind: str, draw) -> bytes:
    data = _good(kind)
    how = draw(st.sampled_from(["value", "drop", "bytes", "truncate"]))
    if how == "bytes":
        return draw(st.binary(max_size=40))
    text = json.dumps(data)
    if how == "truncate":
        return text[: draw(st.integers(0, len(text) - 1))].encode()
    node, keys = data, []
    while isinstance(node, (dict, list)) and node:
        key = draw(st.sampled_from(list(node) if isinstance(node, dict) else list(range(len(node)))))
        keys.append(key)
        if draw(st.booleans()) or not isinstance(node[key], (dict, list)) or not node[key]:
            break  # an empty list or object is replaced whole
        node = node[key]
    if how == "drop" and isinstance(node, dict) and keys:
        node.pop(keys[-1], None)
    elif keys:
        node[keys[-1]] = draw(_json)
    return json.dumps(data).encode()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kind=st.sampled_from(["profile", "trees", "status"]), data=st.data())
def test_fuzzed_stored_files_are_never_a_traceback_or_used_damaged(tmp_path_factory, kind, data):
    root = tmp_path_factory.mktemp("fuzz")
    path = _write(kind, root, _damaged(kind, data.draw))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        value = _read(kind, root)
    if value is None:
        assert not path.exists()
        assert any(issubclass(w.category, DamagedFileWarning) and path.name in str(w.message) for w in caught)
    else:  # what is used passes the one check of its kind, as a whole file does
        _CHECKS[kind](value if kind == "status" else json.loads(json.dumps(value.__dict__)))
        assert path.exists()


@pytest.mark.parametrize("data", [{"bytes_per_s": 0}, {"bytes_per_s": -1.0}, {"bytes_per_s": math.nan}, [], b"\xff{"])
def test_a_damaged_peak_bandwidth_is_moved_aside_and_measured_again(tmp_path, monkeypatch, data):
    from specbench.cost import bandwidth

    path = bandwidth._cache_path(tmp_path)
    path.parent.mkdir(parents=True)
    path.write_bytes(data if isinstance(data, bytes) else json.dumps(data).encode())
    monkeypatch.setattr(bandwidth, "_measure_peak", lambda: 3e9)
    bandwidth._peaks.clear()
    with pytest.warns(DamagedFileWarning, match=path.name):
        assert bandwidth.peak_bandwidth(tmp_path) == 3e9
    assert json.loads(path.read_text())["bytes_per_s"] == 3e9
