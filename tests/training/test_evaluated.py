"""lenx.training.evaluated's names: an evaluation moved aside gets the name `lenx eval --step N`
gives it, and never replaces another file there."""

import json

from lenx.evaluation.evaluate import result_name
from lenx.evaluation.files import is_kept
from lenx.training.evaluated import _move, step_name


def test_step_names_are_those_lenx_eval_gives(tmp_path):
    for task, scaling in ((None, None), ("copy", None), (None, "yarn"), ("passkey", "ntk")):
        latest = tmp_path / result_name(None, scaling, task)
        assert step_name(latest, 20).name == result_name(20, scaling, task)
    kept = step_name(tmp_path / "eval.0a1b2c3d.json", 20)
    assert kept.name == "eval_step20.0a1b2c3d.json" and is_kept(kept)


def test_a_moved_evaluation_never_replaces_another(tmp_path):
    (tmp_path / "eval_step20.json").write_text(json.dumps({"step": 20, "lengths": [64]}))
    (tmp_path / "eval.json").write_text(json.dumps({"step": 20, "lengths": [64, 128]}))
    moved = _move(tmp_path / "eval.json", 20)
    assert is_kept(moved) and json.loads(moved.read_text())["lengths"] == [64, 128]
    assert json.loads((tmp_path / "eval_step20.json").read_text())["lengths"] == [64]
