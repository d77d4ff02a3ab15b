"""Verify cost by node count: trees of n nodes against paths of n tokens; Auto's node budget."""

from __future__ import annotations

import json

import mlx.core as mx
import pytest
from conftest import build_tiny

from specbench.common import identity
from specbench.common.files import DamagedFileWarning
from specbench.core.options import GenerateOptions
from specbench.core.policies import DraftPolicy
from specbench.cost.trees import (
    TreeCosts,
    binary_tree,
    load_tree_costs,
    measure_tree_costs,
    save_tree_costs,
    stored_tree_costs,
    tree_break_even,
    tree_costs_for,
    tree_costs_path,
)


def costs(tree, path=None) -> TreeCosts:
    nodes = [1, 2, 4, 8]
    return TreeCosts("m", "cpu", {}, "fast", 0.01, nodes, tree, path or tree, [0.0] * 4, [0.0] * 4)


def test_measured_tree_costs_are_stored_and_read_back(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBENCH_HOME", str(tmp_path))
    model = build_tiny("qwen3")
    measured = measure_tree_costs(model, nodes=(1, 3, 6), repeats=2, warmup=0, offset=16, plain_tokens=3)
    assert measured.nodes == [1, 3, 6] and measured.repeats == 2
    assert all(c > 0 for c in measured.tree + measured.path)
    assert measured.tree_s[0] == pytest.approx(measured.tree[0] * measured.plain_step_s)
    path = save_tree_costs(measured)
    assert load_tree_costs(path) == measured
    assert tree_costs_for(model) == measured  # stored: read, not measured again
    path.write_text("{")
    with pytest.raises(ValueError, match="damaged or unreadable"):
        load_tree_costs(path)
    with pytest.raises(ValueError, match="node counts"):
        measure_tree_costs(model, nodes=(0, 2))


def test_cost_by_node_count_interpolates_and_extends():
    c = costs([1.2, 1.4, 1.8, 2.6], [1.1, 1.3, 2.0, 3.0])
    assert c.c(0) == 1.0 and c.c(2) == 1.4 and c.c(3) == pytest.approx(1.6)
    assert c.c(12) == pytest.approx(2.6 + 0.2 * 4)  # past 8 nodes at the last slope
    assert c.c(4, "path") == 2.0
    assert tree_break_even(c, d=0.1)(4) == pytest.approx(1.8 + 0.4)
    with pytest.raises(ValueError, match="shape"):
        c.c(2, "star")
    assert binary_tree(5) == [-1, 0, 0, 1, 1]


def test_break_even_and_auto_choose_the_node_budget():
    c = costs([1.2, 1.4, 1.8, 4.0])
    tokens = {1: 1.3, 2: 1.9, 4: 2.3, 8: 3.0}  # 8 nodes yield most but cost too much
    auto = DraftPolicy.auto()
    assert auto.choose_node_budget(tokens, tree_break_even(c)) == 2
    assert auto.max_k == 2 and auto.longest_draft(None) == 2
    with pytest.raises(ValueError, match="at least one"):
        auto.choose_node_budget({}, tree_break_even(c))


def test_speculative_generate_costs_a_tree_drafter_by_node_count_when_stored():
    """With this model's tree costs stored, a tree drafter's break-even is c_tree(n); a path drafter's is not."""
    from specbench.common.identity import device_name, model_key, versions
    from specbench.decoding import speculative_generate
    from specbench.drafters import SuffixDecoding

    model = build_tiny("llama")
    prompt, options = [3, 5, 7, 3, 5, 7, 3, 5], GenerateOptions(max_tokens=3, verify="fast")
    tree_drafter, path_drafter = SuffixDecoding(tree=True), SuffixDecoding()
    before = speculative_generate(
        model, prompt, options, drafter=tree_drafter, policy=DraftPolicy.auto(), progress=None
    )
    dear = [50.0, 60.0, 70.0, 80.0]
    stored = TreeCosts(model_key(model), device_name(), versions(), "fast", 0.01, [1, 2, 4, 8], dear, dear, dear, dear)
    save_tree_costs(stored)
    tree = speculative_generate(model, prompt, options, drafter=tree_drafter, policy=DraftPolicy.auto(), progress=None)
    path = speculative_generate(model, prompt, options, drafter=path_drafter, policy=DraftPolicy.auto(), progress=None)
    assert tree.break_even(4) == pytest.approx(tree_break_even(stored, tree_drafter)(4))
    assert tree.break_even(4) >= 70.0 > path.break_even(4)
    assert before.break_even(4) == pytest.approx(path.break_even(4))
    assert len(list(tree)) == 3


def test_tree_costs_are_keyed_by_the_blas_library_and_hold_what_they_are_stored_for(tmp_path, monkeypatch):
    """As profiles: a file measured under another BLAS is not reused; a file at this key's path holding another
    model's or mode's costs is moved aside with a warning naming it (and measured anew)."""
    from specbench.common.identity import device_name, kernel_key, model_key, versions

    monkeypatch.setenv("SPECBENCH_HOME", str(tmp_path))
    model = build_tiny("llama")
    dear = [50.0, 60.0, 70.0, 80.0]
    stored = TreeCosts(model_key(model), device_name(), versions(), "fast", 0.01, [1, 2, 4, 8], dear, dear, dear, dear)
    path = save_tree_costs(stored)
    assert stored.kernels == kernel_key() and "--k" in path.name
    assert stored_tree_costs(model) == stored
    with monkeypatch.context() as other:
        other.setattr(identity, "blas_in_use", lambda: "OtherBLAS 9.9, 3 threads")
        other.setattr(identity.mx, "default_device", lambda: mx.Device(mx.cpu))
        assert tree_costs_path(stored.model, stored.device, "fast") != path
        assert stored_tree_costs(model) is None and path.exists()  # another BLAS's file: not read, not touched
    for wrong, named in (({"model": "another"}, "model"), ({"kernels": "OtherBLAS"}, "kernels")):
        path.write_text(json.dumps({**stored.to_dict(), **wrong}))
        with pytest.warns(DamagedFileWarning, match=f"{path}.*its {named} are not those it is stored for"):
            assert stored_tree_costs(model) is None
        assert not path.exists()
    path.write_text(json.dumps({**stored.to_dict(), "mode": "psychic"}))
    with pytest.warns(DamagedFileWarning, match="'psychic' is not a verify mode"):
        assert stored_tree_costs(model) is None
