"""`lenx eval --hf DIR --task <suite tasks>`: the suite on a transformers model (tiny, offline)."""

import numpy as np

from test_hf import world  # noqa: F401 (the fixture)
from lenx.evaluation.hf_eval import evaluate_hf_task


def test_suite_on_an_hf_model(world):  # noqa: F811
    root, _ = world
    r = evaluate_hf_task(root / "llama", "niah_single,qa3", corpus="words", data_root=root / "data", lengths=[160],
                         depths=[0.0, 1.0], samples=1, device="cpu", progress=False, write=False)
    assert r["task"] == "niah_single+qa3" and set(r["tasks"]) == {"niah_single", "qa3"}
    for t in r["tasks"].values():
        assert np.array(t["exact"]).shape == (1, 2) and all(v < 0 for v in t["logprob"][0])
        assert 0 <= np.mean(t["exact"]) <= 1 and len(t["instances"]) == 64
