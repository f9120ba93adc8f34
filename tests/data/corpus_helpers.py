"""What the corpus tests share: the fixture texts, archives built in memory, and looks at corpus folders."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

from lenx.data.build import tokenizing as tok_mod

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "data"
TEXTS = FIXTURES / "texts"


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


def mini_gpt2_files(monkeypatch) -> tuple[bytes, bytes]:
    """A miniature GPT-2 vocabulary (encoder.json, vocab.bpe): the 256 byte symbols, two merges, then EOS."""
    from tokenizers import pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    vocab.update({"th": 256, "the": 257, "<|endoftext|>": 258})
    monkeypatch.setattr(tok_mod, "GPT2_EOS_ID", 258)
    return json.dumps(vocab).encode(), b"#version: 0.2\nt h\nth e\n"


def split_texts(c, split):
    """The text of every document of a split, in order."""
    toks, idx = c.tokens(split), c.docs(split)
    return [c.decode(toks[s : s + n]) for s, n in idx]


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file of a folder, by name."""
    return {p.name: p.read_bytes() for p in folder.iterdir()}


def leftovers(root: Path) -> list[str]:
    """What a prepare left beside its corpora: hidden build or old folders (the download cache aside)."""
    return [p.name for p in root.iterdir() if p.name.startswith(".") and p.name != ".cache"]
