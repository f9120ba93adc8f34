"""Carry a prepared corpus to a machine that takes a few dozen MiB at a time: pack its folder into
xz-compressed pieces of at most --piece-mib MiB each, and join, unpack and verify them there.

    python scripts/data/pack_corpus.py pack data/code .carry/code        # here: pieces + pack.json
    python scripts/data/pack_corpus.py unpack .carry/code data/code      # there, once every piece came

Every file of the corpus folder (manifest.json, tokenizer.json, the splits' .bin token files and
.idx.npy indexes) is compressed as an xz stream of its own; the streams are written one after the
other and the whole is cut into pieces `<corpus>.xz.000`, `.001`, ... of --piece-mib MiB (the last
one shorter), so the pieces are as few as the compressed size allows. pack.json records, for each
piece, its size and sha256, and for each file, where its stream lies, its size and the sha256 of
its bytes. `unpack` checks every piece against pack.json before it writes anything (a missing or
damaged piece is named, in one line), then decompresses each file into a hidden folder beside the
destination, checks its size and sha256, and moves the folder into place.

xz because Python reads it without anything installed (lzma), on this machine and the other; the
tokens of a code corpus shrink to about a quarter.

A sharded corpus (`lenx shard`) packs its top-level files only (manifest, tokenizer, val and test,
the train index); its train shards travel as files of their own, as many as the run's steps need
(scripts/data/shards_for_steps.py lists them): `xz -k` each here, `xz -d` it into
`<corpus>/train.shards/` there, and `lenx shard NAME --check` verifies what arrived.

A device call carries the repository's working tree too (64 MiB in all), so a piece must leave room
for it: `pack` prints how big the tree is here and whether a piece fits beside it. Carry the pieces
one call at a time into the same ignored folder of a warm machine (`.carry/` is ignored), and
pack.json with the last; `unpack` then finds them all. `unpack --check` only says which pieces are
there and intact.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import lzma
import os
import shutil
import subprocess
import sys
from pathlib import Path

FORMAT = "lenx-corpus-pack/1"
MIB = 1 << 20
CHUNK = 1 << 20
TRAVEL_MIB = 64  # what one device call carries, the working tree included


class PackError(Exception):
    """A one-line error for the user."""


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


class PieceWriter:
    """One byte stream written as pieces of at most `size` bytes each: `<stem>.000`, `.001`, ..."""

    def __init__(self, folder: Path, stem: str, size: int):
        self.folder, self.stem, self.size = folder, stem, size
        self.pieces: list[dict] = []
        self.offset = 0  # bytes written so far
        self._f, self._hash, self._left = None, None, 0

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while len(view):
            if self._left == 0:
                self._next()
            n = min(self._left, len(view))
            self._f.write(view[:n])
            self._hash.update(view[:n])
            self._left -= n
            self.offset += n
            view = view[n:]

    def _next(self) -> None:
        self._close()
        name = f"{self.stem}.{len(self.pieces):03d}"
        self._f, self._hash, self._left = open(self.folder / name, "wb"), hashlib.sha256(), self.size
        self.pieces.append({"name": name})

    def _close(self) -> None:
        if self._f is not None:
            self.pieces[-1].update(bytes=self._f.tell(), sha256=self._hash.hexdigest())
            self._f.close()
            self._f = None

    def close(self) -> list[dict]:
        self._close()
        return self.pieces


def corpus_files(folder: Path) -> list[Path]:
    """The files of a prepared corpus folder, in a fixed order (hidden and temporary files aside)."""
    if not (folder / "manifest.json").is_file():
        raise PackError(f"{folder} is not a prepared corpus (it has no manifest.json)")
    return sorted(p for p in folder.iterdir() if p.is_file() and not p.name.startswith("."))


def pack(src: Path, out: Path, piece_mib: float, preset: int = 9) -> dict:
    """Write the pieces and pack.json of corpus folder `src` into `out` (created, or empty)."""
    files = corpus_files(src)
    if piece_mib <= 0:
        raise PackError(f"--piece-mib must be > 0, got {piece_mib}")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise PackError(f"{out} exists and is not an empty folder; give a new one")
    name = json.loads((src / "manifest.json").read_text()).get("name") or src.name
    out.mkdir(parents=True, exist_ok=True)
    writer = PieceWriter(out, f"{name}.xz", int(piece_mib * MIB))
    records = []
    for path in files:
        h, start = hashlib.sha256(), writer.offset
        comp = lzma.LZMACompressor(lzma.FORMAT_XZ, preset=preset)
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(CHUNK), b""):
                h.update(chunk)
                writer.write(comp.compress(chunk))
        writer.write(comp.flush())
        records.append({"name": path.name, "bytes": path.stat().st_size, "sha256": h.hexdigest(),
                        "offset": start, "packed_bytes": writer.offset - start})
    record = {"format": FORMAT, "corpus": name, "codec": "xz", "preset": preset, "piece_bytes": writer.size,
              "pieces": writer.close(), "files": records}
    (out / "pack.json").write_text(json.dumps(record, indent=1) + "\n")
    return record


def read_pack(folder: Path) -> dict:
    path = folder / "pack.json"
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        raise PackError(f"{path} is missing; carry it with the pieces") from None
    except ValueError as e:
        raise PackError(f"{path} is not JSON ({e})") from None
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        raise PackError(f"{path} is not a pack of lenx's ({FORMAT})")
    return record


def check_pieces(folder: Path, record: dict) -> list[str]:
    """What is wrong with the pieces in `folder`, one phrase per piece (empty: all there and intact)."""
    problems = []
    for piece in record["pieces"]:
        path = folder / piece["name"]
        if not path.is_file():
            problems.append(f"{piece['name']} is missing")
        elif path.stat().st_size != piece["bytes"]:
            problems.append(f"{piece['name']} has {path.stat().st_size} bytes, not {piece['bytes']}")
        elif sha256_file(path) != piece["sha256"]:
            problems.append(f"{piece['name']} is damaged (sha256 differs)")
    return problems


class PieceReader:
    """The pieces read back as the one byte stream they were cut from."""

    def __init__(self, folder: Path, pieces: list[dict]):
        self._paths = [folder / p["name"] for p in pieces]
        self._f = None

    def read(self, n: int) -> bytes:
        out = []
        while n > 0:
            if self._f is None:
                if not self._paths:
                    raise PackError("the pieces end before the files do; pack.json does not match them")
                self._f = open(self._paths.pop(0), "rb")
            data = self._f.read(n)
            if not data:
                self._f.close()
                self._f = None
                continue
            out.append(data)
            n -= len(data)
        return b"".join(out)


def unpack(folder: Path, dest: Path, force: bool = False) -> dict:
    """Join the pieces in `folder`, decompress every file into `dest` and verify it; `dest` is written
    only when everything matched, and replaced only with `force`."""
    record = read_pack(folder)
    if dest.exists() and not force:
        raise PackError(f"{dest} exists; pass --force to replace it")
    problems = check_pieces(folder, record)
    if problems:
        raise PackError(f"{len(problems)} of {len(record['pieces'])} pieces are not ready in {folder}: "
                        + "; ".join(problems))
    tmp = dest.parent / f".{dest.name}.unpack-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        reader = PieceReader(folder, record["pieces"])
        for f in record["files"]:
            _unpack_file(reader, f, tmp / f["name"])
        if dest.exists():
            shutil.rmtree(dest)
        tmp.rename(dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return record


def _unpack_file(reader: PieceReader, f: dict, path: Path) -> None:
    comp, h, size, left = lzma.LZMADecompressor(lzma.FORMAT_XZ), hashlib.sha256(), 0, f["packed_bytes"]
    with open(path, "wb") as out:
        while left > 0:
            data = reader.read(min(CHUNK, left))
            left -= len(data)
            try:
                plain = comp.decompress(data)
            except lzma.LZMAError as e:
                raise PackError(f"{f['name']}'s stream is damaged ({e})") from None
            h.update(plain)
            size += len(plain)
            out.write(plain)
    if not comp.eof or size != f["bytes"] or h.hexdigest() != f["sha256"]:
        raise PackError(f"{f['name']} unpacked to {size} bytes that do not match pack.json "
                        f"({f['bytes']} bytes, sha256 {f['sha256'][:12]}...)")


def tree_mib(where: Path) -> float | None:
    """What a device call carries of the git repository holding `where` (tracked and untracked files
    git does not ignore), in MiB; None outside a repository."""
    try:
        root = subprocess.run(["git", "-C", str(where), "rev-parse", "--show-toplevel"], capture_output=True,
                              text=True, check=True).stdout.strip()
        names = subprocess.run(["git", "-C", root, "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                               capture_output=True, check=True).stdout.split(b"\0")
    except (OSError, subprocess.CalledProcessError):
        return None
    paths = (Path(root) / n.decode() for n in names if n)
    return sum(p.stat().st_size for p in paths if p.is_file()) / MIB


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("pack", help="pack a corpus folder into pieces and pack.json")
    p.add_argument("corpus", type=Path, help="a prepared corpus folder (data/code)")
    p.add_argument("out", type=Path, help="a new or empty folder for the pieces (.carry/code)")
    p.add_argument("--piece-mib", type=float, default=40,
                   help="the size of a piece in MiB (default 40: a device call carries 64 MiB with the working tree)")
    p.add_argument("--preset", type=int, default=9, choices=range(10), metavar="0-9", help="xz preset (default 9)")
    u = sub.add_parser("unpack", help="join the pieces, unpack and verify the corpus folder")
    u.add_argument("pieces", type=Path, help="the folder holding pack.json and the pieces")
    u.add_argument("dest", type=Path, nargs="?", help="the corpus folder to write (data/code)")
    u.add_argument("--check", action="store_true", help="only say which pieces are there and intact")
    u.add_argument("--force", action="store_true", help="replace dest if it exists")
    args = ap.parse_args(argv)
    try:
        if args.command == "pack":
            rec = pack(args.corpus, args.out, args.piece_mib, args.preset)
            total = sum(f["bytes"] for f in rec["files"])
            packed = sum(p["bytes"] for p in rec["pieces"])
            print(f"{args.corpus}: {len(rec['files'])} files, {total / MIB:.1f} MiB -> {len(rec['pieces'])} pieces, "
                  f"{packed / MIB:.1f} MiB in {args.out}")
            tree = tree_mib(args.out)
            if tree is not None:
                fits = "fits" if args.piece_mib + tree <= TRAVEL_MIB else "does NOT fit"
                print(f"the working tree here is {tree:.1f} MiB: one piece beside it {fits} in a call's "
                      f"{TRAVEL_MIB} MiB")
            for i, p in enumerate(rec["pieces"]):
                print(f"  call {i + 1}: carry {args.out / p['name']} and {args.out / 'pack.json'}  "
                      f"({p['bytes'] / MIB:.1f} MiB, sha256 {p['sha256'][:16]})")
            print(f"then, there: python scripts/data/pack_corpus.py unpack {args.out} data/{rec['corpus']}")
        elif args.check:
            rec = read_pack(args.pieces)
            problems = check_pieces(args.pieces, rec)
            print(f"{len(rec['pieces']) - len(problems)} of {len(rec['pieces'])} pieces there and intact"
                  + ("" if not problems else ": " + "; ".join(problems)))
            return 1 if problems else 0
        else:
            if args.dest is None:
                raise PackError("unpack needs the corpus folder to write (dest), or --check")
            rec = unpack(args.pieces, args.dest, args.force)
            print(f"{args.dest}: {len(rec['files'])} files of corpus {rec['corpus']} unpacked and verified (sha256)")
    except (PackError, OSError) as e:  # OSError: a full disk, an unreadable file
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
