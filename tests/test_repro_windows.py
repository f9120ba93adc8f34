"""scripts/repro/windows_epoch.py and domains_epoch.py: the test windows of the single-epoch tables,
the same for every run, each window's domain and the tables split by it (issue 44); the committed
windows.md and domains.md are what the scripts make of the committed runs."""

import json
import shutil
import sys

from _compare import same_json, same_text
from test_repro_epoch import RESULTS, fake_run, script


def committed_runs(tmp_path):
    here = tmp_path / "results" / "epoch"
    for ev in RESULTS.glob("runs/T*/*/eval.json"):
        (here / ev.parent.relative_to(RESULTS)).mkdir(parents=True)
        shutil.copy(ev, here / ev.relative_to(RESULTS))
    shutil.copy(RESULTS / "window_domains.json", here)
    return here


def test_the_committed_windows_breakdown_is_up_to_date(tmp_path):
    here = committed_runs(tmp_path)
    out = script("windows_epoch.py", "--results", "results/epoch", cwd=tmp_path)
    assert out.returncode == 0 and out.stdout == "wrote results/epoch/windows.md\n", out.stderr
    made = json.loads((here / "windows.json").read_text())
    assert same_json(made, json.loads((RESULTS / "windows.json").read_text())) == []
    assert same_text((here / "windows.md").read_text(), (RESULTS / "windows.md").read_text()) == []
    assert made["runs"] == 37 and made["tables"] == ["T128", "T512", "T2048"] and made["documents"] == 64
    kernel = made["pool"]["kernel files"]
    assert kernel["range_95"][0] <= kernel["windows"] <= kernel["range_95"][1]
    assert sum(d["pool"] for d in made["pool"].values()) == 527
    assert sum(d["windows"] for d in made["pool"].values()) == 64


def test_the_committed_domain_tables_are_up_to_date(tmp_path):
    here = committed_runs(tmp_path)
    out = script("domains_epoch.py", "--results", "results/epoch", cwd=tmp_path)
    assert out.returncode == 0 and out.stdout == "wrote results/epoch/domains.md\n", out.stderr
    made = json.loads((here / "domains.json").read_text())
    assert same_json(made, json.loads((RESULTS / "domains.json").read_text())) == []
    assert same_text((here / "domains.md").read_text(), (RESULTS / "domains.md").read_text()) == []
    assert sum(made["windows"].values()) == 64 and list(made["tables"]) == ["T128", "T512", "T2048"]
    cell = made["tables"]["T512"]["dapev2-kerple"]["16384"]
    assert cell["seeds"] == 2 and cell["other minus kerple"]["hi"] < 0 < cell["other"]["lo"]


def test_domain_rule_reads_the_opening():
    sys.path.insert(0, str(RESULTS.parents[1] / "scripts" / "repro"))
    from domains_epoch import domain

    assert domain("// SPDX-License-Identifier: GPL-2.0\n#include <linux/mm.h>\n") == "kernel files"
    assert domain("#!/bin/bash\n# SPDX-License-Identifier: GPL-2.0\n") == "kernel files"
    assert domain("% a package's manual\n\\documentclass{ltxdoc}\n") == "LaTeX"
    assert domain("=encoding utf8\n\n=head1 NAME\n\nperlop - operators\n") == "POD"
    assert domain(".. SPDX-License-Identifier: GPL-2.0\n\n=========\nIP Sysctl\n=========\n") == "reStructuredText"
    assert domain("THE LIFE OF KING HENRY V\n\nby William Shakespeare\n") == "prose and other"


def test_domains_need_their_file_or_a_matching_corpus(tmp_path):
    here = committed_runs(tmp_path)
    (here / "window_domains.json").unlink()
    out = script("domains_epoch.py", "--results", "results/epoch", cwd=tmp_path)
    assert out.returncode == 2 and out.stderr.startswith("error: results/epoch/window_domains.json is missing"), out.stderr
    corpus = tmp_path / "code"
    corpus.mkdir()
    (corpus / "manifest.json").write_text(json.dumps({"fingerprint": {"test": "another split"}}))
    out = script("domains_epoch.py", "--corpus", "code", cwd=tmp_path)
    assert out.returncode == 2 and out.stderr == ("error: code's test split is not the one the runs scored "
                                                  "(fingerprints differ)\n"), out.stderr
    out = script("domains_epoch.py", "--corpus", "nowhere", cwd=tmp_path)
    assert out.returncode == 2 and out.stderr == "error: --corpus nowhere is not a prepared corpus (no manifest.json)\n"


def test_runs_on_other_windows_are_refused(tmp_path):
    runs = tmp_path / "results" / "epoch" / "runs"
    fake_run(runs / "T128" / "kerple-s0", "kerple", 0, 0.0)
    other = fake_run(runs / "T128" / "rope-s0", "rope", 0, 0.1) / "eval.json"
    result = json.loads(other.read_text())
    other.write_text(json.dumps(result | {"window_documents": result["window_documents"][::-1]}))
    out = script("windows_epoch.py", "--results", "results/epoch", cwd=tmp_path)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and lines == ["error: the runs score 2 different sets of windows; each table needs its "
                                             "own breakdown"], lines
    assert not (tmp_path / "results" / "epoch" / "windows.md").exists()
    bad = script("windows_epoch.py", "--results", "nowhere", cwd=tmp_path)
    assert bad.returncode == 2 and bad.stderr == "error: --results nowhere has no runs folder\n"
