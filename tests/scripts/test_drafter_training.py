"""scripts.gpu.drafter_training: the drafters experiment's head and draft-model phases on a tiny model."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import build_tiny

from scripts.gpu import drafter_training
from scripts.gpu.draft_training import HELDOUT_KINDS
from specbench.drafters.draft_model import load_draft_model
from specbench.models.mtp.attach import load_head
from specbench.train.mtp_data import WindowSampler
from specbench.train.mtp_training import TrainConfig, init_head


def setting():
    model = build_tiny("llama")
    config = TrainConfig.quick()
    config.steps, config.batch_size, config.seq_len, config.warmup_steps, config.eval_windows = 1, 1, 8, 1, 0
    stream = np.random.default_rng(0).integers(0, 64, size=400).astype(np.int32)
    sampler = WindowSampler({"code": stream}, {"code": 1.0}, config.seq_len)
    split = {"prompts": {kind: [[1, 2, 3, 4], [5, 6, 7]] for kind in HELDOUT_KINDS}, "sources": {"chat": "test"}}
    return model, config, sampler, split, {"evaluation": {}}


@pytest.mark.parametrize("ships", [True, False])
def test_the_head_phase_scores_both_heads_and_writes_the_new_one_only_when_it_ships(tmp_path, monkeypatch, ships):
    model, config, sampler, split, results = setting()
    decided = []

    def decision(new, old):
        decided.append((new, old))
        return {"ships": ships, "decision": "new head ships" if ships else "shipped head stays"}

    monkeypatch.setattr(drafter_training, "head_decision", decision)
    shipped = init_head(model)
    head, files = drafter_training.head_phase(model, sampler, split, config, shipped, 3, results, tmp_path, "t", print)
    assert set(results["evaluation"]) == {"mtp (new)", "mtp (shipped)"}
    assert decided == [(results["evaluation"]["mtp (new)"], results["evaluation"]["mtp (shipped)"])]
    assert set(results["evaluation"]["mtp (new)"]) == set(HELDOUT_KINDS)
    assert results["mtp"]["ships"] is ships and results["mtp"]["recipe"]["depth"] == config.depth
    assert json.loads((tmp_path / "drafters.json").read_text())["mtp"]["ships"] is ships
    if not ships:
        assert files == {} and not list(tmp_path.glob("mtp-*"))
        return
    assert set(files) == {"mtp", "mtp_record"}
    record = json.loads(files["mtp_record"].read_text())
    assert record["heldout_split"] == {"sources": split["sources"], "k": 3, "tokens": 3}
    assert load_head(model, files["mtp"]) is not None
    assert drafter_training.parameter_count(head) > 0


def test_the_draft_phase_writes_its_own_layers_and_scores_the_model_as_shipped(tmp_path):
    model, config, sampler, split, results = setting()
    draft, path = drafter_training.draft_phase(model, sampler, split, config, 1, 16, 3, results, tmp_path, "t", print)
    assert path == tmp_path / "draft-t.safetensors" and path.exists()
    assert results["draft_model"]["layers"] == 1 and results["draft_model"]["intermediate_size"] == 16
    assert results["parameters"]["draft_own"] > 0
    assert set(results["evaluation"]["draft-model"]) == set(HELDOUT_KINDS)
    again = load_draft_model(model, path)
    assert len(again.model.layers) == len(draft.model.layers) == 1
    assert "draft-model" in json.loads((tmp_path / "drafters.json").read_text())["evaluation"]
