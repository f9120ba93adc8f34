"""Issue 30, "data lost or silently wrong": runs pin the corpus they were trained on and refuse
another one, replacing a corpus needs --force, `lenx eval` keeps every earlier evaluation, `lenx
compare` never overwrites a file it did not write (nor, by default, an earlier comparison), and a
JSONL record whose "text" is not a string stops `lenx prepare`. Every case runs `python -m lenx` as a
user would, from another working directory with relative paths, and checks the one-line error (no
traceback) or the data kept."""

import json
import os
from pathlib import Path
import random
import shutil
import subprocess
import sys
from types import SimpleNamespace

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
REPO = SRC.parent
TINY = ["model.n_layer=1", "model.d_model=32", "model.n_head=2", "train.seq_len=32", "train.batch_size=4",
        "train.steps=2", "train.device=cpu", "data.corpus='mydata'", "eval.windows=4", "eval.scored=16",
        "eval.max_length=64"]
SETS = [a for s in TINY for a in ("--set", s)]
WORDS = {"a": "alpha beta gamma delta kernel score map head token window length train".split(),
         "b": "moby whale sea ship captain ahab white deep storm sail".split()}


def lenx(*args, cwd):
    # this checkout's lenx, whatever the working directory (a relative PYTHONPATH would not follow it)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "lenx", *args], capture_output=True, text=True, timeout=600,
                          cwd=cwd, env=env)


def ok(out):
    assert out.returncode == 0, out.stderr[-3000:]
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    return out


def one_line_error(out, *needles) -> str:
    lines = out.stderr.splitlines()
    assert out.returncode == 2, (out.returncode, out.stderr[-3000:])
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    assert len(lines) == 1 and lines[0].startswith("error:"), out.stderr[-3000:]
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def snapshot(root: Path) -> dict:
    """Every file under root: name -> bytes."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def write_jsonl(path: Path, words: list[str], seed: int, docs: int = 40) -> None:
    rng = random.Random(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"text": " ".join(rng.choice(words) for _ in range(rng.randint(60, 120)))
                                        + "."}) + "\n" for _ in range(docs)))


def make_work(work: Path) -> Path:
    """work/: inputs/a.jsonl and b.jsonl (other words), data/mydata prepared from a.jsonl, runs/r (a
    tiny model trained on it through the CLI) evaluated at 32 and 64, and elsewhere/, the folder the
    tests run lenx from. Made once a session (tests/conftest.py); each module gets a copy, the `work` fixture."""
    write_jsonl(work / "inputs" / "a.jsonl", WORDS["a"], 0)
    write_jsonl(work / "inputs" / "b.jsonl", WORDS["b"], 1)
    (work / "elsewhere").mkdir()
    ok(lenx("prepare", "mydata", "--from", "inputs/a.jsonl", "--vocab-size", "300", cwd=work))
    ok(lenx("train", "-c", "tiny", *SETS, "-o", "runs/r", "--no-progress", cwd=work))
    ok(lenx("eval", "runs/r", "--lengths", "32,64", "--device", "cpu", cwd=work))
    return work


def copy_work(work: Path, dest: Path) -> Path:
    """A copy of the fixture's folder whose run reads the copy's corpus (config.toml's data.root is
    absolute)."""
    shutil.copytree(work, dest, symlinks=True)
    config = dest / "runs" / "r" / "config.toml"
    config.write_text(config.read_text().replace(str(work), str(dest)))
    return dest


# --- 1. corpus identity -----------------------------------------------------------------------------

def test_the_run_records_its_corpus_fingerprint(work):
    meta = json.loads((work / "runs" / "r" / "meta.json").read_text())
    manifest = json.loads((work / "data" / "mydata" / "manifest.json").read_text())
    assert meta["corpus_fingerprint"] == manifest["fingerprint"]
    assert set(meta["corpus_fingerprint"]) == {"tokenizer", "train", "val", "test"}
    assert meta["corpus_prepared"] == manifest["created"]
    assert json.loads((work / "runs" / "r" / "eval.json").read_text())["corpus_fingerprint"] == manifest["fingerprint"]


def test_replacing_a_corpus_needs_force_and_its_runs_refuse_the_new_one(work, tmp_path):
    w = copy_work(work, tmp_path / "w")
    here, run = w / "elsewhere", "../runs/r"
    corpus, kept = snapshot(w / "data" / "mydata"), snapshot(w / "runs")

    # over an existing corpus: a one-line error before any work, the corpus untouched
    one_line_error(lenx("prepare", "mydata", "--from", "../inputs/b.jsonl", "--root", "../data", "--vocab-size",
                        "300", cwd=here), "corpus 'mydata' already exists at ../data/mydata",
                   "b.jsonl", "pass --force to replace it")
    assert snapshot(w / "data" / "mydata") == corpus
    # --force with input that cannot build a corpus: the old one stays as it was
    (w / "inputs" / "empty").mkdir()
    one_line_error(lenx("prepare", "mydata", "--from", "../inputs/empty", "--root", "../data", "--force", cwd=here),
                   "no usable documents")
    assert snapshot(w / "data" / "mydata") == corpus and sorted(p.name for p in (w / "data").iterdir()) == ["mydata"]
    ok(lenx("prepare", "mydata", "--from", "../inputs/b.jsonl", "--root", "../data", "--vocab-size", "300", "--force",
            cwd=here))
    assert snapshot(w / "data" / "mydata") != corpus

    # every command that opens the run's corpus refuses the new one in one line, writing nothing
    what = ("is not the one ../runs/r was trained on: its tokenizer, train split, val split and test split differ",
            "prepared")
    for args in (["eval", run, "--device", "cpu"],
                 ["eval", run, "--task", "copy", "--lengths", "64", "--samples", "1", "--device", "cpu"],
                 ["generate", run, "--prompt", "alpha beta", "--max-new-tokens", "3", "--device", "cpu"],
                 ["plot", run, "--attention", "--length", "16"],
                 ["train", "--resume", run, "--no-progress"]):
        one_line_error(lenx(*args, cwd=here), *what)
        assert snapshot(w / "runs") == kept, args
    # a sweep does not reuse (nor mix with new ones) runs trained on the old version
    shutil.copytree(w / "runs" / "r", w / "sweep" / "rope")
    one_line_error(lenx("sweep", "--methods", "rope", "-c", "tiny", *SETS, "--set", "data.root='../data'",
                        "-o", "../sweep", "--no-progress", cwd=here),
                   "data.corpus: 'mydata' was prepared anew since the run was trained (tokenizer, train split, val "
                   "split, test split changed)", "--force")

    # the corpus it was trained on, prepared again from the same input and settings, is accepted
    ok(lenx("prepare", "mydata", "--from", "../inputs/a.jsonl", "--root", "../data", "--vocab-size", "300", "--force",
            cwd=here))
    assert {f: b for f, b in snapshot(w / "data" / "mydata").items() if f != "manifest.json"} == \
        {f: b for f, b in corpus.items() if f != "manifest.json"}
    ok(lenx("eval", run, "--lengths", "32", "--device", "cpu", cwd=here))


def test_a_run_from_before_fingerprints_evaluates_with_a_note_and_its_vocabulary_is_checked(work, tmp_path):
    w = copy_work(work, tmp_path / "w")
    here, run = w / "elsewhere", "../runs/r"
    meta_path = w / "runs" / "r" / "meta.json"
    meta = json.loads(meta_path.read_text())
    del meta["corpus_fingerprint"], meta["corpus_prepared"]  # meta.json as lenx wrote it before
    meta_path.write_text(json.dumps(meta, indent=2))
    out = ok(lenx("eval", run, "--lengths", "32", "--device", "cpu", cwd=here))
    notes = [line for line in out.stderr.splitlines() if "fingerprint" in line]
    assert notes == [f"note: {run} records no corpus fingerprint (trained before lenx recorded one): lenx cannot "
                     f"check that {w / 'data' / 'mydata'} still holds the corpus it was trained on"]
    # a corpus with another vocabulary (an IndexError deep in the model before) is refused all the same
    ok(lenx("prepare", "mydata", "--from", "../inputs/a.jsonl", "--root", "../data", "--vocab-size", "280", "--force",
            cwd=here))
    kept = snapshot(w / "runs")
    for args in (["eval", run, "--device", "cpu"], ["generate", run, "--prompt", "alpha", "--device", "cpu"]):
        one_line_error(lenx(*args, cwd=here), "its vocabulary has 280 tokens, the run's model 300")
    assert snapshot(w / "runs") == kept


def test_a_committed_run_from_before_fingerprints_is_accepted_with_a_note(capsys):
    """results/v125's runs were trained before meta.json recorded a fingerprint."""
    from lenx.config import load_config
    from lenx.data import DataError
    from lenx.runs import check_run_corpus

    run = REPO / "results" / "v125" / "kerple-s0"
    assert "corpus_fingerprint" not in json.loads((run / "meta.json").read_text())
    cfg = load_config(str(run / "config.toml"))
    corpus = SimpleNamespace(name="tech", root=Path("/data/tech"), vocab_size=cfg.model.vocab_size, manifest={},
                             fingerprint=lambda: pytest.fail("no fingerprint to compare with"))
    check_run_corpus(run, cfg, corpus)
    check_run_corpus(run, cfg, corpus)  # the note comes once
    assert capsys.readouterr().err.count("records no corpus fingerprint") == 1
    corpus.vocab_size += 1
    with pytest.raises(DataError, match=f"its vocabulary has {cfg.model.vocab_size + 1} tokens"):
        check_run_corpus(run, cfg, corpus)


def test_prepare_never_replaces_a_folder_that_is_not_a_corpus(work, tmp_path):
    (tmp_path / "root" / "mine").mkdir(parents=True)
    (tmp_path / "root" / "mine" / "thesis.tex").write_text("years of work\n")
    before = snapshot(tmp_path / "root")
    for force in ([], ["--force"]):
        one_line_error(lenx("prepare", "mine", "--from", str(work / "inputs" / "a.jsonl"), "--root", "root", *force,
                            cwd=tmp_path), "root/mine exists and is not a lenx corpus")
        assert snapshot(tmp_path / "root") == before


# --- 2. evaluations and comparisons are kept ---------------------------------------------------------

def test_eval_keeps_every_earlier_evaluation_and_plot_and_compare_read_the_latest(work, tmp_path):
    w = copy_work(work, tmp_path / "w")
    here, run, folder = w / "elsewhere", "../runs/r", w / "runs" / "r"
    first = (folder / "eval.json").read_bytes()
    key_of = lambda: sorted(p.name for p in folder.glob("eval*.json"))  # noqa: E731

    out = ok(lenx("eval", run, "--lengths", "32", "--device", "cpu", cwd=here))
    files = key_of()
    assert len(files) == 2 and "eval.json" in files
    kept = folder / next(f for f in files if f != "eval.json")
    assert kept.read_bytes() == first  # the four-length evaluation, byte for byte
    assert json.loads((folder / "eval.json").read_text())["lengths"] == [32]
    assert f"kept it as {run}/{kept.name}" in out.stderr and "lengths 32,64, 4 windows" in out.stderr
    # the same evaluation again replaces itself; other settings keep the one before
    ok(lenx("eval", run, "--lengths", "32", "--device", "cpu", cwd=here))
    assert key_of() == files
    ok(lenx("eval", run, "--lengths", "32", "--windows", "2", "--device", "cpu", cwd=here))
    assert len(key_of()) == 3
    ok(lenx("eval", run, "--task", "copy", "--lengths", "64", "--samples", "1", "--device", "cpu", cwd=here))
    ok(lenx("eval", run, "--task", "copy", "--lengths", "64", "--samples", "2", "--device", "cpu", cwd=here))
    copies = sorted(p.name for p in folder.glob("eval_copy*.json"))
    assert len(copies) == 2 and json.loads((folder / "eval_copy.json").read_text())["samples"] == 2

    # lenx plot RUN draws the latest files only; a kept one when named
    drawn = ok(lenx("plot", run, cwd=here)).stdout.split()
    assert sorted(Path(p).name for p in drawn) == ["eval_copy_heatmap.png", "perplexity.png", "retrieval_copy.png"]
    drawn = ok(lenx("plot", f"{run}/{kept.name}", cwd=here)).stdout.split()
    assert [Path(p).name for p in drawn] == [f"{kept.stem}_perplexity.png", f"{kept.stem}_delta_p.png"]
    # lenx compare reads the latest eval.json
    ok(lenx("compare", run, "-o", "cmp.json", "--resamples", "100", cwd=here))
    assert json.loads((here / "cmp.json").read_text())["lengths"] == [32]


def test_plot_and_compare_read_committed_run_folders_with_a_single_old_eval_json(tmp_path):
    """results/v125's runs hold one eval.json each, written before evaluations were kept or
    recorded a corpus fingerprint."""
    runs = tmp_path / "v125"
    for name in ("kerple-s0", "kerple-s1", "dapev2-kerple-s0", "dapev2-kerple-s1"):
        shutil.copytree(REPO / "results" / "v125" / name, runs / name)
    here = tmp_path / "elsewhere"
    here.mkdir()
    out = ok(lenx("compare", "../v125", "--reference", "kerple", "--resamples", "100", "-o", "cmp.json", cwd=here))
    written = json.loads((here / "cmp.json").read_text())
    assert written["written_by"] == "lenx compare" and set(written["methods"]) == {"kerple", "dapev2-kerple"}
    assert "wrote cmp.json" in out.stdout
    drawn = ok(lenx("plot", "../v125/kerple-s0", cwd=here)).stdout.split()
    assert sorted(Path(p).name for p in drawn) == ["delta_p.png", "perplexity.png"]


def test_compare_never_overwrites_a_file_it_did_not_write_nor_an_earlier_comparison(work, tmp_path):
    here, run = tmp_path, os.path.relpath(work / "runs" / "r", tmp_path)
    cmp = ["compare", run, "--resamples", "100"]
    notes = tmp_path / "notes.json"
    notes.write_text('{"mine": 1}\n')
    for args in (["-o", "notes.json"], ["-o", "notes.json", "--force"]):
        one_line_error(lenx(*cmp, *args, cwd=here), "notes.json exists and was not written by lenx compare")
        assert notes.read_text() == '{"mine": 1}\n'
    (tmp_path / "compare.json").write_text("my own compare.json\n")
    one_line_error(lenx(*cmp, cwd=here), "compare.json exists and was not written by lenx compare")
    assert (tmp_path / "compare.json").read_text() == "my own compare.json\n"
    (tmp_path / "compare.json").unlink()

    # the default compare.json: written once, then replaced only with --force
    ok(lenx(*cmp, cwd=here))
    first = (tmp_path / "compare.json").read_bytes()
    assert json.loads(first)["written_by"] == "lenx compare"
    one_line_error(lenx(*cmp, "--seed", "1", cwd=here), "compare.json holds an earlier comparison; pass --force")
    assert (tmp_path / "compare.json").read_bytes() == first
    ok(lenx(*cmp, "--seed", "1", "--force", cwd=here))
    assert json.loads((tmp_path / "compare.json").read_text())["seed"] == 1
    # a file it names with --out is replaced when lenx compare wrote it, today or before the marker
    ok(lenx(*cmp, "-o", "compare.json", cwd=here))
    shutil.copy(REPO / "results" / "v125" / "compare.json", tmp_path / "old.json")
    assert "written_by" not in json.loads((tmp_path / "old.json").read_text())
    ok(lenx(*cmp, "-o", "old.json", cwd=here))
    assert json.loads((tmp_path / "old.json").read_text())["written_by"] == "lenx compare"


def test_compare_refuses_runs_evaluated_on_another_version_of_the_corpus(work, tmp_path):
    result = json.loads((work / "runs" / "r" / "eval.json").read_text())
    for method, test_split in (("kerple", "0" * 64), ("rope", "1" * 64), ("alibi", None)):
        run = tmp_path / "sweep" / f"{method}-s0"
        run.mkdir(parents=True)
        shutil.copy(work / "runs" / "r" / "config.toml", run)
        fingerprint = None if test_split is None else result["corpus_fingerprint"] | {"test": test_split}
        (run / "eval.json").write_text(json.dumps(result | {"method": method, "corpus_fingerprint": fingerprint}))
    one_line_error(lenx("compare", "sweep", "--resamples", "100", "-o", "cmp.json", cwd=tmp_path),
                   "runs evaluated on another version of corpus 'mydata' than sweep/kerple-s0",
                   "sweep/rope-s0 (their eval.json records other corpus fingerprints)")
    assert not (tmp_path / "cmp.json").exists()
    # an eval.json from before fingerprints (alibi's) compares with either
    shutil.rmtree(tmp_path / "sweep" / "rope-s0")
    ok(lenx("compare", "sweep", "--resamples", "100", "-o", "cmp.json", cwd=tmp_path))


# --- 3. JSONL records whose "text" is not a string ----------------------------------------------------

BAD = [
    pytest.param('{"text": null}', '"text" is null, not a string', id="null"),
    pytest.param('{"text": 12345}', '"text" is a number (12345), not a string', id="int"),
    pytest.param('{"text": 1.5}', '"text" is a number (1.5), not a string', id="float"),
    pytest.param('{"text": ["a", "b"]}', '"text" is a list (["a", "b"]), not a string', id="list"),
    pytest.param('{"text": {"body": "x"}}', '"text" is an object ({"body": "x"}), not a string', id="object"),
    pytest.param('{"text": true}', '"text" is a boolean (true), not a string', id="boolean"),
    pytest.param('{"body": "no text"}', 'has no "text" field', id="missing"),
    pytest.param('["text"]', 'is a list, not a JSON object with a "text" field', id="not-an-object"),
]


@pytest.mark.parametrize("record, needle", BAD)
def test_a_record_whose_text_is_not_a_string_is_a_one_line_error_naming_the_line(tmp_path, record, needle):
    inputs, here = tmp_path / "inputs", tmp_path / "elsewhere"
    inputs.mkdir()
    here.mkdir()
    (inputs / "docs.jsonl").write_text('{"text": "one document"}\n\n{"text": "another"}\n' + record + "\n")
    line = one_line_error(lenx("prepare", "mine", "--from", "../inputs/docs.jsonl", "--root", "../data", cwd=here),
                          "../inputs/docs.jsonl line 4: " + needle, "--skip-bad-records")
    assert line.endswith("fix or remove that line, or pass --skip-bad-records to leave such lines out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["elsewhere", "inputs"]  # nothing written


def test_skip_bad_records_leaves_them_out_and_counts_them(tmp_path):
    good = [json.dumps({"text": f"document {i} " + "word " * 20}) for i in range(6)]
    bad = [record.values[0] for record in BAD]
    lines = [good[0], bad[0], good[1], bad[1], bad[2], good[2], good[3], *bad[3:], good[4], good[5]]
    (tmp_path / "docs.jsonl").write_text("\n".join(lines) + "\n")
    here = tmp_path / "elsewhere"
    here.mkdir()
    out = ok(lenx("prepare", "mine", "--from", "../docs.jsonl", "--root", "../data", "--vocab-size", "300",
                  "--skip-bad-records", cwd=here))
    manifest = json.loads((tmp_path / "data" / "mine" / "manifest.json").read_text())
    source = manifest["sources"][0]
    numbers = [i + 1 for i, line in enumerate(lines) if line in bad]
    assert source["bad_records_skipped"] == len(bad) == 8 and source["bad_record_lines"] == numbers
    assert source["lines"] == manifest["cleaning"]["docs_read"] == 6
    assert "skipped 8 bad records of ../docs.jsonl (--skip-bad-records; lines " \
           f"{', '.join(map(str, numbers))})" in out.stderr  # the path as the user gave it
    # a clean file records that nothing was skipped
    (tmp_path / "clean.jsonl").write_text("\n".join(good) + "\n")
    ok(lenx("prepare", "clean", "--from", "../clean.jsonl", "--root", "../data", "--vocab-size", "300", cwd=here))
    assert json.loads((tmp_path / "data" / "clean" / "manifest.json").read_text())["sources"][0][
        "bad_records_skipped"] == 0
    # the option is for records (JSONL, parquet, ...), not a folder of text files
    (tmp_path / "texts").mkdir()
    (tmp_path / "texts" / "a.txt").write_text("a document\n")
    one_line_error(lenx("prepare", "texts", "--from", "../texts", "--root", "../data", "--skip-bad-records", cwd=here),
                   "is a folder of text files (one document each, no records); --text-field, --split and "
                   "--skip-bad-records apply to records")
