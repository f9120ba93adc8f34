"""Read text files out of archives we downloaded: .deb, tar(.gz/.xz), R lazy-load data.

Everything here works on local files only (no network), so it is testable offline.
Files are streamed: nothing is unpacked to disk except where a program must run
(see `unpack_deb`).
"""

from __future__ import annotations

import gzip
import io
import shutil
import subprocess
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from ..errors import DataError

Want = Callable[[str], bool]

AR_MAGIC = b"!<arch>\n"


class _Window(io.RawIOBase):
    """Read-only view of `size` bytes of an open file, from its current position."""

    def __init__(self, f: BinaryIO, size: int):
        self._f, self._left = f, size

    def readable(self) -> bool:
        return True

    def readinto(self, buf) -> int:
        n = min(len(buf), self._left)
        if n == 0:
            return 0
        data = self._f.read(n)
        buf[: len(data)] = data
        self._left -= len(data)
        return len(data)


def ar_members(f: BinaryIO) -> Iterator[tuple[str, int]]:
    """Walk a Unix `ar` archive (what a .deb is): yield (name, size), file positioned at data.

    The caller may read up to `size` bytes; we seek past the rest ourselves.
    """
    if f.read(8) != AR_MAGIC:
        raise DataError(f"{getattr(f, 'name', 'archive')} is not a .deb (ar) file; delete it from the cache and retry")
    while True:
        header = f.read(60)
        if len(header) < 60:
            return
        name = header[:16].decode("ascii", "replace").strip().rstrip("/")
        size = int(header[48:58].decode("ascii").strip())
        start = f.tell()
        yield name, size
        # Members are padded to an even offset.
        f.seek(start + size + (size & 1))


def _open_deb_data(deb: Path, f: BinaryIO) -> tarfile.TarFile:
    """Open the data.tar.* member of an opened .deb as a streaming tarfile."""
    for name, size in ar_members(f):
        if not name.startswith("data.tar"):
            continue
        suffix = name[len("data.tar"):]
        modes = {"": "r|", ".gz": "r|gz", ".xz": "r|xz", ".bz2": "r|bz2"}
        if suffix in modes:
            return tarfile.open(fileobj=io.BufferedReader(_Window(f, size), 1 << 20), mode=modes[suffix])
        # zstd is not in Python's standard library before 3.14: let dpkg-deb unpack it.
        return _dpkg_fsys_tarfile(deb)
    raise DataError(f"{deb} has no data.tar member; delete it from the cache and retry")


def _dpkg_fsys_tarfile(deb: Path) -> tarfile.TarFile:
    if shutil.which("dpkg-deb") is None:
        raise DataError(f"{deb.name} uses a compression Python cannot read; install dpkg (dpkg-deb) and retry")
    proc = subprocess.Popen(["dpkg-deb", "--fsys-tarfile", str(deb)], stdout=subprocess.PIPE)
    return tarfile.open(fileobj=proc.stdout, mode="r|")


def _clean(name: str) -> str:
    return name[2:] if name.startswith("./") else name.lstrip("/")


def iter_tar(tf: tarfile.TarFile, want: Want, gunzip: bool = True) -> Iterator[tuple[str, bytes]]:
    """Yield (path, bytes) of regular files whose path `want` accepts.

    With gunzip, `foo.tex.gz` is offered to `want` as `foo.tex` and yielded decompressed
    (Debian gzips most documentation).
    """
    for m in tf:
        if not m.isfile():
            continue
        name = _clean(m.name)
        plain = name[:-3] if gunzip and name.endswith(".gz") else name
        if not want(plain):
            continue
        data = tf.extractfile(m).read()
        if plain != name:
            try:
                data = gzip.decompress(data)
            except (OSError, EOFError):
                continue  # a broken .gz member: skip that one file, not the package
        yield plain, data


def iter_deb(deb: Path, want: Want) -> Iterator[tuple[str, bytes]]:
    """Yield (path, bytes) of wanted files in a .deb, without installing or unpacking it."""
    deb = Path(deb)
    try:
        with open(deb, "rb") as f, _open_deb_data(deb, f) as tf:
            yield from iter_tar(tf, want)
    except (tarfile.TarError, EOFError, OSError) as e:
        if isinstance(e, FileNotFoundError):
            raise DataError(f"{deb} does not exist") from e
        raise DataError(f"{deb.name} is damaged ({e}); delete it from the cache and retry") from e


def iter_tarball(path: Path, want: Want, gunzip: bool = False) -> Iterator[tuple[str, bytes]]:
    """Yield (path, bytes) of wanted files in a tar archive (any compression Python reads)."""
    path = Path(path)
    try:
        with tarfile.open(path, "r:*") as tf:
            yield from iter_tar(tf, want, gunzip=gunzip)
    except (tarfile.TarError, EOFError, OSError) as e:
        raise DataError(f"{path.name} is damaged ({e}); delete it from the cache and retry") from e


def iter_deb_nested_tarball(deb: Path, inner: Want, want: Want) -> Iterator[tuple[str, bytes]]:
    """Wanted files of a tarball that itself sits inside a .deb (linux-source ships one).

    Streams both levels, so the ~1 GB inner tree never touches the disk.
    """
    deb = Path(deb)
    try:
        with open(deb, "rb") as f, _open_deb_data(deb, f) as tf:
            for m in tf:
                if m.isfile() and inner(_clean(m.name)):
                    with tarfile.open(fileobj=tf.extractfile(m), mode="r|*") as inner_tf:
                        yield from iter_tar(inner_tf, want, gunzip=False)
                    return
    except (tarfile.TarError, EOFError, OSError) as e:
        raise DataError(f"{deb.name} is damaged ({e}); delete it from the cache and retry") from e
    raise DataError(f"{deb.name} holds no inner tarball; the package layout changed, please report it")


def unpack_deb(deb: Path, dest: Path) -> None:
    """Unpack a whole .deb under `dest` (only for programs we must run, e.g. diatheke)."""
    deb = Path(deb)
    with open(deb, "rb") as f, _open_deb_data(deb, f) as tf:
        # The "data" filter refuses absolute paths, `..` and links out of `dest`.
        tf.extractall(dest, filter="data")


# --- R lazy-load databases (.rdb/.rdx), as in R packages' data/ folders -----------------

def _r_unserialize(raw: bytes):
    import rdata  # only the books corpus needs it

    # rdata parses .rda files; an .rda is "RDX3\n" followed by one serialization stream.
    parsed = rdata.parser.parse_data(b"RDX3\n" + raw)
    return rdata.conversion.convert(parsed)


def _r_block(blob: bytes) -> bytes:
    """Decompress one .rdb block: 4-byte big-endian length, then zlib (or a typed codec)."""
    import bz2
    import lzma
    import zlib

    body = blob[4:]
    if body[:1] == b"\x78":  # plain zlib (R's default, compress=TRUE)
        return zlib.decompress(body)
    # Otherwise a one-byte codec tag follows the length (R's compress=2/3 formats).
    kind, body = body[:1], body[1:]
    if kind == b"Z":
        return lzma.decompress(body)
    if kind == b"2":
        return bz2.decompress(body)
    if kind == b"1":
        return zlib.decompress(body)
    if kind == b"0":
        return body
    raise DataError(f"unknown R lazy-load block codec {kind!r}; the package layout changed, please report it")


def read_r_lazyload(rdb: bytes, rdx: bytes) -> dict[str, object]:
    """Read every variable of an R lazy-load database (contents of .rdb and .rdx), without R.

    The .rdx is a (gzipped) serialized list whose `variables` entry maps each
    name to (offset, length) of a compressed serialized object in the .rdb.
    """
    try:
        import rdata  # noqa: F401
    except ImportError as e:
        raise DataError("reading R data needs the `rdata` package; run `pip install rdata`") from e
    if rdx[:2] == b"\x1f\x8b":
        rdx = gzip.decompress(rdx)
    index = _r_unserialize(rdx)
    out = {}
    for name, (off, length) in index["variables"].items():
        off, length = int(off), int(length)
        out[str(name)] = _r_unserialize(_r_block(rdb[off : off + length]))
    return out
