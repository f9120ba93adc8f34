"""The `code` corpus end to end, offline (stand-in sources): near-duplicates dropped before the split,
long documents reserved for test by default, one-line errors before any download."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from corpus_helpers import split_texts
from lenx.data import DataError, open_corpus
from lenx.data.build import prepare_corpus
from lenx.data.build import sources as sources_mod
from lenx.data.build.neardup import rule
from lenx.data.build.sources import Source
from lenx.data.build.splits import long_test_default

KW = dict(vocab_size=400, progress=False, long_test=4, long_test_tokens=600)


def code_like(seed: int, n_funcs: int) -> str:
    rng = np.random.default_rng(seed)
    names = [f"{a}_{b}" for a in ("dev", "buf", "reg", "irq", "ctx") for b in ("init", "read", "put", "lock")]
    return "".join(f"static int {rng.choice(names)}{seed}_{i}(struct {rng.choice(names)} *p)\n{{\n"
                   f"\treturn p->{rng.choice(names)} + {int(rng.integers(1000))};\n}}\n\n" for i in range(n_funcs))


def fake_code(monkeypatch) -> dict[str, list[str]]:
    """Stand-in `code` sources: a tree of 40 files (10 long, 30 short) where 5 files are near-copies of
    others, and a text source. Returns the texts by kind ("kept", "near")."""
    tree = [code_like(i, 60 if i < 10 else 3) for i in range(40)]
    near = [tree[0].replace("+ ", "+  ").replace("return", "return", 1) + "/* v2 */\n",  # a long one
            tree[1] + "static int extra(void)\n{\n\treturn 0;\n}\n",
            tree[12].replace("\t", "    "), tree[13] + "\n/* SPDX */\n", tree[14].replace("{\n", "{ ")]
    prose = [f"Paragraph {i}: the kernel schedules tasks; chapter {i} explains why. " * 8 for i in range(10)]

    def tree_get(reg):
        return [], [(f"linux-tree:{i}.c", t) for i, t in enumerate(tree + near)]

    def prose_get(reg):
        return [], [(f"doc:{i}", t) for i, t in enumerate(prose)]

    monkeypatch.setitem(sources_mod.BUILTIN_SOURCES, "code",
                        lambda: [Source("linux-tree", tree_get), Source("texts", prose_get)])
    return {"kept": tree + prose, "near": near}


def test_code_corpus_drops_near_duplicates_and_reserves_long_test_documents(tmp_path, monkeypatch):
    texts = fake_code(monkeypatch)
    m = prepare_corpus("code", tmp_path, **KW)
    assert m["params"]["near_dup"] == rule() and m["params"]["long_test"] == 4
    nd = m["near_dup"]
    assert nd["docs_dropped"] == 5 and nd["docs_checked"] == 55
    assert {d["doc"] for d in nd["near_duplicate_docs"]} == {f"linux-tree:{i}.c" for i in range(40, 45)}
    assert {d["of"] for d in nd["near_duplicate_docs"]} == {f"linux-tree:{i}.c" for i in (0, 1, 12, 13, 14)}
    c = open_corpus("code", tmp_path)
    got = {s: split_texts(c, s) for s in ("train", "val", "test")}
    everything = sum(got.values(), [])
    assert sorted(everything) == sorted(texts["kept"])  # every other document, each in one split
    assert not set(texts["near"]) & set(everything)
    assert m["long_test"]["reserved_docs"] == 4 and m["splits"]["test"]["docs_ge_600_tokens"] >= 4
    assert m["splits"]["test"]["docs"] < len(everything) // 2  # the rest is split as usual
    # settings unchanged: already prepared
    assert prepare_corpus("code", tmp_path, **KW) == m


def test_code_corpus_defaults_to_300_long_test_documents(tmp_path, monkeypatch):
    assert long_test_default("code") == (300, 16385) and long_test_default("tech") == (0, 16384)
    fake_code(monkeypatch)
    with pytest.raises(DataError, match=r"needs at least 302 .* the 300 reserved for test by --long-test") as e:
        prepare_corpus("code", tmp_path, vocab_size=400, progress=False)
    assert "\n" not in str(e.value) and not (tmp_path / "code").exists()
    many = [Source("linux-tree", lambda reg: ([], [(str(i), code_like(i, 2)) for i in range(400)]))]
    monkeypatch.setitem(sources_mod.BUILTIN_SOURCES, "code", lambda: many)
    with pytest.raises(DataError, match=r"--long-test 300 needs 300 documents of >= 16385 tokens, .* has at most 0"):
        prepare_corpus("code", tmp_path, vocab_size=400, progress=False)


def test_missing_datasketch_fails_before_any_download(tmp_path, monkeypatch):
    def no_sources():
        raise AssertionError("the sources were read")

    monkeypatch.setitem(sources_mod.BUILTIN_SOURCES, "code", no_sources)
    monkeypatch.setitem(sys.modules, "datasketch", None)
    with pytest.raises(DataError, match=r"needs the `datasketch` package; run `pip install 'lenx\[dedup\]'`"):
        prepare_corpus("code", tmp_path, **KW)
    assert list(tmp_path.iterdir()) == []
