"""`lenx suite-export` the way a user runs it: from another folder, relative paths. Its instances are
those `lenx eval RUN --task` scores (the same hash), and bad input is one line before anything is written."""

import json

from test_nothing_lost import lenx, ok, one_line_error, snapshot

GRID = ["--lengths", "256", "--depths", "0.5", "--samples", "2"]


def test_the_export_holds_the_instances_lenx_eval_scores(work):
    ok(lenx("eval", "../runs/r", "--task", "niah_multikey,qa3", *GRID, "--device", "cpu", cwd=work / "elsewhere"))
    out = ok(lenx("suite-export", "../exports/a", "--like", "../runs/r", "--task", "niah_multikey,qa3", *GRID,
                  cwd=work / "elsewhere"))
    assert "lenx_suite" in out.stdout
    folder = work / "exports" / "a"
    result = json.loads((work / "runs" / "r" / "eval_niah_multikey+qa3.json").read_text())
    manifest = json.loads((folder / "lenx_suite.json").read_text())
    assert manifest["corpus_fingerprint"] == result["corpus_fingerprint"]
    assert manifest["seed"] == result["seed"] and manifest["split"] == result["split"]
    for t in ("niah_multikey", "qa3"):
        assert manifest["tasks"][t]["instances"] == result["tasks"][t]["instances"]
        rows = [json.loads(line) for line in (folder / f"{t}.jsonl").read_text().splitlines()]
        assert [(r["length"], r["depth"], r["index"]) for r in rows] == [(256, 0.5, 0), (256, 0.5, 1)]
        assert all(r["answer"] in r["prompt"] for r in rows)   # every task states its answer in the input
        assert all(r["continuation"] == " " + r["answer"] for r in rows)
        for suffix in ("", "_logprob"):
            text = (folder / f"lenx_{t}{suffix}.yaml").read_text()
            assert f"task: lenx_{t}{suffix}\n" in text and "lenx_suite.load" in text
    # an earlier export is replaced only with --force; what was there stays otherwise
    before = snapshot(folder)
    one_line_error(lenx("suite-export", "../exports/a", "--like", "../runs/r", "--task", "qa1", *GRID,
                        cwd=work / "elsewhere"), "--force")
    assert snapshot(folder) == before
    ok(lenx("suite-export", "../exports/a", "--like", "../runs/r", "--task", "qa1", *GRID, "--force",
            cwd=work / "elsewhere"))
    assert sorted(p.name for p in folder.iterdir()) == ["lenx_qa1.yaml", "lenx_qa1_logprob.yaml", "lenx_suite.json",
                                                        "lenx_suite.py", "qa1.jsonl"]


def test_bad_input_is_one_line_before_anything_is_written(work):
    where = work / "elsewhere"
    cases = [
        (["--like", "../runs/r", "--task", "qa1,nope"], "nope"),
        (["--like", "../runs/r", "--task", "ruler", "--lengths", "20"], "minimum"),
        (["--like", "../runs/r", "--task", "qa1", "--depths", "2"], "depths"),
        (["--like", "../runs/r", "--task", "qa1", "--samples", "0"], "--samples"),
        (["--like", "../runs/r", "--corpus", "mydata", "--task", "qa1"], "one of them"),
        (["--task", "qa1"], "--like RUN"),
        (["--corpus", "mydata", "--data-root", "../data", "--task", "qa1"], "--lengths"),
        (["--like", "../runs/r", "--data-root", "../data", "--task", "qa1"], "--data-root"),
    ]
    for args, needle in cases:
        one_line_error(lenx("suite-export", "../exports/bad", *args, cwd=where), needle)
    assert not (work / "exports" / "bad").exists()
    (work / "exports" / "other").mkdir(parents=True)
    (work / "exports" / "other" / "notes.txt").write_text("mine")
    one_line_error(lenx("suite-export", "../exports/other", "--like", "../runs/r", "--task", "qa1", *GRID, "--force",
                        cwd=where), "other files")
    assert (work / "exports" / "other" / "notes.txt").read_text() == "mine"
