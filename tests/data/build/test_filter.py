"""The non-text filter: the rule on crafted documents, its record in the manifest, `--keep-non-text`
(the corpus exactly as the builder made it before the filter), corpora prepared before the filter,
and the CLI."""

from __future__ import annotations

import base64
import hashlib
import json
import os
from pathlib import Path
import subprocess
import sys

import numpy as np
import pytest

from corpus_helpers import FIXTURES, snapshot, split_texts
from lenx.data import DataError, open_corpus
from lenx.data.build import prepare_corpus
from lenx.data.build import text as text_mod
from lenx.data.build.nontext import MAX_SHARE, find_non_text, is_non_text, non_text_share, rule, summary_line
from lenx.data.build.splits import drop_from_splits, split_docs

SRC = Path(__file__).resolve().parents[3] / "src"


def pseudo_random_bytes(n: int) -> bytes:
    """Bytes that look random and never change (a SHA-256 chain, no RNG stream that could)."""
    out, block = b"", b"lenx"
    while len(out) < n:
        block = hashlib.sha256(block).digest()
        out += block
    return out[:n]


LATEX = ("\\documentclass{article}\n\\usepackage{amsmath}\n\\usepackage[margin=2cm]{geometry}\n"
         "\\begin{document}\n\\section{Energy}\nThe energy of a photon is $E = h\\nu$, and\n"
         "\\begin{equation}\n  \\int_0^\\infty e^{-x^2}\\,dx = \\frac{\\sqrt{\\pi}}{2}.\n\\end{equation}\n"
         "See \\url{https://example.org/physics/notes/2024/photon-energy-and-frequency.html}.\n\\end{document}\n")


def crafted_docs() -> dict[str, str]:
    blob = base64.b64encode(pseudo_random_bytes(3000)).decode()
    hexed = pseudo_random_bytes(1500).hex()
    records = ",".join(f'{{"id":{i},"key":"{hashlib.md5(str(i).encode()).hexdigest()[:12]}","w":{i * 0.37:.2f}}}'
                       for i in range(60))
    return {
        "prose": ("The river rose slowly through the night, and by morning the lower fields were under water. "
                  "Farmers moved their animals to the ridge, where the old road runs between two stone walls. ") * 4,
        "code": ("def checksum(data: bytes) -> int:\n    \"\"\"A 16-bit ones' complement sum.\"\"\"\n    total = 0\n"
                 "    for i in range(0, len(data), 2):\n        total += (data[i] << 8) + (data[i + 1] if i + 1 < "
                 "len(data) else 0)\n        total = (total & 0xFFFF) + (total >> 16)\n    return ~total & 0xFFFF\n"),
        "latex": LATEX,
        "short": "Hi.",
        "chinese": "长文档的中文段落没有空格" * 60,  # 720 characters without whitespace, and text
        # MIME-wrapped base64 of random bytes (an embedded image), plain hex (`xxd -p`, PostScript image data),
        # minified data on one line, and a text file padded with NULs (what tech's test document 35 is).
        "base64": "Content-Type: image/png\n\n" + "\n".join(blob[i:i + 76] for i in range(0, len(blob), 76)) + "\n",
        "hex": "\n".join(hexed[i:i + 60] for i in range(0, len(hexed), 60)) + "\n",
        "minified": f"var data=[{records}];",
        "nul_padded": LATEX + "\x00" * 2000,
    }


NON_TEXT = ("base64", "hex", "minified", "nul_padded")


def test_the_rule_on_crafted_documents():
    docs = crafted_docs()
    for name, text in docs.items():
        share = non_text_share(text)
        assert 0 <= share <= 1
        assert is_non_text(text) == (name in NON_TEXT), (name, share)
        if name not in NON_TEXT:
            assert share == 0, name
    assert non_text_share(docs["base64"]) > 0.95 and non_text_share(docs["hex"]) > 0.95
    assert non_text_share(docs["minified"]) > 0.99
    assert non_text_share(docs["nul_padded"]) == pytest.approx(2000 / len(docs["nul_padded"]))
    assert non_text_share("") == 0


def test_what_counts_as_a_non_text_span():
    assert non_text_share("a\tb\nc\fd\re") == 0  # whitespace controls are text
    assert non_text_share("ab\x1bcd") == 0.2 and non_text_share("ab\x85cd") == 0.2  # C0 and C1 controls
    # An encoded run mixes letters and digits: a long word or a long number is not one.
    assert non_text_share("Donaudampfschifffahrtsgesellschaftskapitaenswitwe" * 2) == 0
    assert non_text_share("3141592653589793238462643383279502884197169399375105820974944592") == 0
    assert non_text_share("x " + "ab12" * 10) == 40 / 42
    assert non_text_share("x " + "ab12" * 9) == 0  # 36 characters: shorter than an encoded run
    # Unbroken runs: printable ASCII (Chinese without spaces is text: "chinese" above), 16 different characters.
    run = "".join(chr(33 + i % 16) for i in range(256))  # 16 different characters
    assert non_text_share("x " + run) == 256 / 258 and non_text_share("x " + run[1:]) == 0
    assert non_text_share("x " + run.replace("#", "!")) == 0  # 15 different characters: a ruler, a fill
    # Spans that overlap count once: an encoded run inside an unbroken one, and NULs beside both.
    assert non_text_share("{" + base64.b64encode(pseudo_random_bytes(300)).decode() + "}" + "\x00" * 98) == 1
    # The threshold: at least MAX_SHARE of the characters.
    n, text = round(MAX_SHARE * 1000), "ab " * 1000
    assert is_non_text(text[:1000 - n] + "\x00" * n) and not is_non_text(text[:1001 - n] + "\x00" * (n - 1))


def test_find_non_text_finds_them_and_records_the_rule():
    docs = list(crafted_docs().items())
    drop, record = find_non_text(docs)
    assert drop.tolist() == [i for i, (d, _) in enumerate(docs) if d in NON_TEXT]
    assert record["rule"] == "non-text share" and record | rule() == record
    assert record["applied"] is True and record["docs_checked"] == len(docs)
    assert record["docs_non_text"] == record["docs_dropped"] == 4
    assert record["chars_dropped"] == sum(len(t) for d, t in docs if d in NON_TEXT)
    listed = record["non_text_docs"]
    assert sorted(x["doc"] for x in listed) == sorted(NON_TEXT)
    assert [x["share"] for x in listed] == sorted((x["share"] for x in listed), reverse=True)  # highest first
    assert listed[-1] == {"doc": "nul_padded", "share": round(non_text_share(docs[-1][1]), 4),
                          "chars": len(docs[-1][1])}

    none, kept_record = find_non_text(docs, keep=True)
    assert none.tolist() == []
    assert kept_record == record | {"applied": False, "docs_dropped": 0, "chars_dropped": 0}


# The builder's output on these inputs before the filter existed (commit c80e1a3, tokenizers 0.23.3):
# --keep-non-text must give it byte for byte, and ordinary text must give it with the filter too.
BEFORE_THE_FILTER = {
    "with_non_text": {"tokenizer": "e72c396200aefb9033aa139ec7e54e1f6904d7ec1a759b44a2c66e1cb42c686b",
                      "train": "62b002242d6a3d9d346bdd73c8bb1831c8c7b3305db65b5b7e88e9d629856754",
                      "val": "65b3b8a4935fdef99c657ea835330fb2c38335f53b433f912298c1f3202eabd2",
                      "test": "571725f038ff345e1cc4f3bc73191e41014b431775d5244ab3bea272a011fd6f"},
    "texts": {"tokenizer": "ef99ae686b6a1298ec0d7cc8e8bfc0e5f1574b05b90da9ddc1ce730325e1736a",
              "train": "15e04c1ce98c9ca06a64cbb2eaec16bb22e60b1d81ddff129d72129cb2564db3",
              "val": "4a80ded71c75408204d6820c758b02ecffb8385070fb3deb20d2f2acfc57b7f6",
              "test": "e641e58d45d95a2ab929847e3a320c53f3e9930494adb263d812e55d9d1dfe83"},
    "pile_sample": {"tokenizer": "fe638fc45164c82e4f8281d3c90456a5404e4b23cc339a6efdd119568f4938e8",
                    "train": "d32d5762eb58d21ca9d6690b4220d829b0d8a41abad03ee525df418380f302aa",
                    "val": "fb7e63d89cb5fe4d0972bfaa0c4cfa03e1994d7c8da2f77b3f2740104dd5fa0f",
                    "test": "bbab95a9df2280cc214e11b1275fc3c2bb35d83c1c4c0ea173796ab5a6cdd775"},
}
KW = dict(vocab_size=300, progress=False)


@pytest.fixture
def mixed_jsonl(tmp_path) -> Path:
    """The JSONL fixture's records, then the crafted documents (ordinary ones and four non-text ones)."""
    lines = (FIXTURES / "pile_sample.jsonl").read_text().splitlines()
    texts = [json.loads(line)["text"] for line in lines if line.strip()] + list(crafted_docs().values())
    path = tmp_path / "mixed.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return path


def corpus_files(folder: Path) -> dict[str, bytes]:
    return {name: data for name, data in snapshot(folder).items() if name != "manifest.json"}


def test_prepare_drops_non_text_and_keep_non_text_builds_as_before(tmp_path, mixed_jsonl):
    m = prepare_corpus("mixed", tmp_path, from_path=mixed_jsonl, **KW)
    nt = m["non_text"]
    assert nt["applied"] and nt["docs_checked"] == 15 and nt["docs_dropped"] == 4
    assert {x["doc"] for x in nt["non_text_docs"]} == {"mixed.jsonl:14", "mixed.jsonl:15", "mixed.jsonl:16",
                                                        "mixed.jsonl:17"}
    assert m["params"]["non_text"] == rule() and m["cleaning"]["docs_kept"] == 15
    assert sum(s["docs"] for s in m["splits"].values()) == 11
    c = open_corpus("mixed", tmp_path)
    texts = sum((split_texts(c, s) for s in ("train", "val", "test")), [])
    docs = crafted_docs()
    assert all(docs[name] not in texts for name in NON_TEXT)
    assert all(docs[name] in texts for name in docs if name not in NON_TEXT)
    assert m["fingerprint"] != BEFORE_THE_FILTER["with_non_text"]

    kept = prepare_corpus("kept", tmp_path, from_path=mixed_jsonl, keep_non_text=True, **KW)
    assert kept["fingerprint"] == BEFORE_THE_FILTER["with_non_text"]
    assert "non_text" not in kept["params"]  # the params a corpus prepared before the filter records
    assert kept["non_text"] == nt | {"applied": False, "docs_dropped": 0, "chars_dropped": 0}
    assert sum(s["docs"] for s in kept["splits"].values()) == 15

    # The other documents stay in the split they have without the filter, in the same order, except that
    # val, which held only the base64 document, takes the last document of train.
    old = open_corpus("kept", tmp_path)
    was = {s: [t for t in split_texts(old, s) if t in texts] for s in ("train", "val", "test")}
    assert split_texts(old, "val") == [docs["base64"]] and was["val"] == []
    assert split_texts(c, "test") == was["test"]
    assert split_texts(c, "train") == was["train"][:-1] and split_texts(c, "val") == was["train"][-1:]


def test_ordinary_text_builds_as_before(folder_corpus, tmp_path):
    _, m = folder_corpus  # the fixture folder, with the filter on: nothing in it is dropped
    assert m["non_text"]["docs_dropped"] == 0 and m["non_text"]["non_text_docs"] == []
    assert m["fingerprint"] == BEFORE_THE_FILTER["texts"]
    pile = prepare_corpus("pile", tmp_path, from_path=FIXTURES / "pile_sample.jsonl", **KW)
    assert pile["fingerprint"] == BEFORE_THE_FILTER["pile_sample"]


def test_a_corpus_prepared_before_the_filter(tmp_path, mixed_jsonl):
    """Its manifest has no "non_text" entry: it opens with the same fingerprint, `--keep-non-text` takes
    it as prepared (nothing rebuilt), and preparing it with the filter needs --force, which says why."""
    prepare_corpus("old", tmp_path, from_path=mixed_jsonl, keep_non_text=True, **KW)
    path = tmp_path / "old" / "manifest.json"
    manifest = json.loads(path.read_text())
    del manifest["non_text"]
    path.write_text(json.dumps(manifest))
    files = snapshot(tmp_path / "old")

    assert open_corpus("old", tmp_path).fingerprint() == BEFORE_THE_FILTER["with_non_text"]
    assert prepare_corpus("old", tmp_path, from_path=mixed_jsonl, keep_non_text=True, **KW) == manifest
    with pytest.raises(DataError, match=r"other settings: non_text None, now .*--keep-non-text builds it that "
                                        r"way.*pass --force") as e:
        prepare_corpus("old", tmp_path, from_path=mixed_jsonl, **KW)
    assert "\n" not in str(e.value)
    assert snapshot(tmp_path / "old") == files

    new = prepare_corpus("old", tmp_path, from_path=mixed_jsonl, force=True, **KW)
    assert new["non_text"]["docs_dropped"] == 4


def test_only_non_text_documents_is_a_one_line_error(tmp_path):
    src = tmp_path / "junk.jsonl"
    docs = crafted_docs()
    src.write_text("".join(json.dumps({"text": docs[name]}) + "\n" for name in NON_TEXT))
    with pytest.raises(DataError, match=r"all 4 are non-text \(non-text share >= 0.3\).*--keep-non-text"):
        prepare_corpus("junk", tmp_path, from_path=src, **KW)
    assert not (tmp_path / "junk").exists()


def test_a_split_left_empty_takes_a_document_from_the_biggest(tmp_path):
    members = {"train": np.array([2, 0, 1]), "val": np.array([], dtype=np.int64), "test": np.array([3])}
    out = drop_from_splits(members, np.array([3]), 0, 0.25)
    assert out["train"].tolist() == [2, 0] and out["val"].tolist() == [] and out["test"].tolist() == [1]
    assert drop_from_splits(members, np.zeros(0, dtype=np.int64), 0, 0.25) is members

    texts = [crafted_docs()[name] for name in ("prose", "code", "latex", "base64")]
    # A seed that deals the base64 document, alone, to test.
    seed = next(s for s in range(100) if split_docs(np.array([len(t) for t in texts]), s, 0, 0.25).tolist()
                == [0, 0, 0, 2])
    src = tmp_path / "four.jsonl"
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    m = prepare_corpus("four", tmp_path, from_path=src, seed=seed, val_frac=0, test_frac=0.25, **KW)
    assert m["non_text"]["docs_dropped"] == 1
    assert [m["splits"][s]["docs"] for s in ("train", "val", "test")] == [2, 0, 1]


def test_long_test_never_reserves_a_non_text_document(tmp_path, monkeypatch):
    """--long-test draws as without the filter, so the splits stay as they were, unless the draw holds a
    non-text document: then it draws again among the text documents."""
    long = [" ".join(f"w{(i * 7 + j * j) % 97}" for j in range(1500)) for i in range(6)]
    short = [" ".join(f"w{(i + j) % 89}" for j in range(40)) for i in range(20)]
    blob = base64.b64encode(pseudo_random_bytes(6000)).decode()
    texts = long + short + ["\n".join(blob[i:i + 76] for i in range(0, len(blob), 76))]
    src = tmp_path / "long.jsonl"
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    draws, real = [], text_mod.reserve_long_docs

    def reserve(*args):
        draws.append(real(*args))
        return draws[-1]

    monkeypatch.setattr(text_mod, "reserve_long_docs", reserve)
    kw = dict(long_test=3, long_test_tokens=1000, val_frac=0.1, test_frac=0.1, **KW)
    seen = set()
    for seed in range(12):
        draws.clear()
        m = prepare_corpus("lt", tmp_path, from_path=src, seed=seed, force=True, **kw)
        assert m["non_text"]["docs_dropped"] == 1 and m["long_test"]["reserved_docs_ge_min_tokens"] == 3
        assert m["long_test"]["corpus_docs_ge_min_tokens"] == 6
        filtered = {s: split_texts(open_corpus("lt", tmp_path), s) for s in ("train", "val", "test")}
        if len(draws) == 2:  # the first draw held the non-text document (the last one)
            assert 26 in draws[0] and 26 not in draws[1]
            seen.add("drawn again")
        else:
            kept = prepare_corpus("lt", tmp_path, from_path=src, seed=seed, force=True, keep_non_text=True, **kw)
            assert kept["long_test"]["reserved_docs"] == 3
            was = {s: [t for t in split_texts(open_corpus("lt", tmp_path), s) if t != texts[-1]]
                   for s in ("train", "val", "test")}
            assert filtered == was
            seen.add("as without the filter")
        if len(seen) == 2:
            break
    assert seen == {"drawn again", "as without the filter"}


def test_the_synthetic_corpus_has_no_filter(tmp_path):
    m = prepare_corpus("synthetic", tmp_path, progress=False)
    assert "non_text" not in m and "non_text" not in m["params"] and summary_line(m) is None
    with pytest.raises(DataError, match="--keep-non-text applies to text corpora"):
        prepare_corpus("synthetic", tmp_path, progress=False, keep_non_text=True)


def lenx(*args, cwd):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "lenx", *args], capture_output=True, text=True, timeout=600,
                          cwd=cwd, env=env)


def test_prepare_cli_reports_the_filter_and_keeps_with_the_flag(tmp_path, mixed_jsonl):
    args = ["prepare", "mixed", "--from", str(mixed_jsonl), "--root", "data", "--vocab-size", "300", "--no-progress"]
    out = lenx(*args, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    m = json.loads((tmp_path / "data" / "mixed" / "manifest.json").read_text())  # stdout: a summary
    assert m["non_text"]["docs_dropped"] == 4
    assert ("non-text documents: 4 of 15 dropped, 11,899 characters (non-text share >= 0.3 (control characters, "
            "encoded runs of >= 40, unbroken runs of >= 256 of >= 16 different characters))") in out.stderr.splitlines()

    out = lenx(*args, "--keep-non-text", "--force", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert json.loads((tmp_path / "data" / "mixed" / "manifest.json").read_text())["fingerprint"] == BEFORE_THE_FILTER["with_non_text"]
    assert "non-text documents: 4 of 15 kept (--keep-non-text; rule: non-text share >= 0.3" in out.stderr

    out = lenx("prepare", "synthetic", "--root", "data", "--keep-non-text", cwd=tmp_path)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.strip().splitlines() == [
        "error: --keep-non-text applies to text corpora; the synthetic corpus is generated token ids"]

