"""The builder's output is pinned: a built-in corpus (from offline stand-in sources) and user data,
byte for byte, as the in-memory builder made them before the builder streamed its documents."""

from __future__ import annotations

import base64
import hashlib

import pytest

from lenx.data.build import prepare_corpus
from lenx.data.build import sources as sources_mod
from lenx.data.build.sources import Source


def _words(seed: int, n: int) -> str:
    """n words that never change (a SHA-256 chain, no RNG stream that could)."""
    out, block = [], str(seed).encode()
    while len(out) < n:
        block = hashlib.sha256(block).digest()
        out += [block[i:i + 3].hex()[: 2 + block[i] % 5] for i in range(0, 30, 3)]
    return " ".join(out[:n])


def stand_in_books(monkeypatch) -> None:
    """Three "books" sources with what real sources hold: bytes and str, CRLF, a BOM, bytes that are
    not UTF-8, an empty document, duplicates within and across sources, a base64 blob, long and short
    documents."""
    blob = base64.b64encode(hashlib.sha256(b"x").digest() * 120).decode()

    def one(label: str, k: int) -> Source:
        def get(reg):
            docs = [(f"{label}:{i}", _words(k * 100 + i, 40 + (i * 37 % 11) * (200 if i % 4 == 0 else 20)))
                    for i in range(12)]
            docs += [(f"{label}:crlf", f"{label} line one\r\nline two\r\n".encode()),
                     (f"{label}:bom", "\ufeff" + _words(k, 30)), (f"{label}:latin1", b"caf\xe9 " * 50),
                     (f"{label}:empty", b" \n\t"), (f"{label}:dup", _words(1, 60)),
                     (f"{label}:blob", "\n".join(blob[i:i + 76] for i in range(0, len(blob), 76)))]
            return [], docs
        return Source(label, get)

    monkeypatch.setitem(sources_mod.BUILTIN_SOURCES, "books",
                        lambda: [one(n, k) for k, n in enumerate(("sotu", "austen", "moby-dick"))])


# Computed by the in-memory builder (commit 1c95653, tokenizers 0.23.3).
PINNED = {
    "plain": {"tokenizer": "6470da6fea0a8fc74720ee66fb3343317a911cbb82304fa65dafbed5acf61da8",
              "train": "40e72a5fb54e7af96b5b5830c34c2fba67a07fd86242e89c3923bd93ddba7471",
              "val": "6826bb747427978e9b49a8ae7a934efb7772d6a8bea56fa3b80cba7b4dadb7db",
              "test": "ac98559eb442fa4a5d6f750c2b869406b7ebf768a76d5f9d3a18b130291615e9"},
    "long_test": {"tokenizer": "72efe3083611a5c9eb4cbfcb199e061ee0053e1199671984e5e705a2495c9c4a",
                  "train": "fceff191c1fda332a768115fdeaae92ddfcf696e594675611fc1f17399c80c77",
                  "val": "9a7fb8d48d94c78fc7399926abc27de31bd6de1f2af08f3edc8d614ef6108c99",
                  "test": "c9bae56aa806913447167aed3d0a1894e47f050b6904c136fa18363c1c02ab23"},
    "keep_non_text": {"tokenizer": "6470da6fea0a8fc74720ee66fb3343317a911cbb82304fa65dafbed5acf61da8",
                      "train": "da02c2c84aeccfe1848e25f6c8a8847b6fe14442f1c612ac52d8c0dfeab0ee70",
                      "val": "6826bb747427978e9b49a8ae7a934efb7772d6a8bea56fa3b80cba7b4dadb7db",
                      "test": "ac98559eb442fa4a5d6f750c2b869406b7ebf768a76d5f9d3a18b130291615e9"},
}
CASES = {"plain": {}, "long_test": dict(long_test=3, long_test_tokens=400), "keep_non_text": dict(keep_non_text=True)}


@pytest.mark.parametrize("case", list(CASES))
def test_a_builtin_corpus_is_byte_identical(tmp_path, monkeypatch, case):
    stand_in_books(monkeypatch)
    m = prepare_corpus("books", tmp_path, vocab_size=300, progress=False, val_frac=0.1, test_frac=0.1, **CASES[case])
    assert m["cleaning"]["duplicates_dropped"] == 6 and m["non_text"]["docs_non_text"] == 1
    assert m.get("long_test", {}).get("reserved_docs_ge_min_tokens", 3) == 3
    assert m["fingerprint"] == PINNED[case]


def user_jsonl(path) -> None:
    """The stand-in documents as a user's JSONL file (an empty line and a duplicate among them)."""
    import json

    lines = [json.dumps({"text": _words(i, 30 + (i * 53 % 13) * (150 if i % 3 == 0 else 15))}) for i in range(40)]
    lines[7] = ""
    lines[20] = lines[4]
    path.write_text("\n".join(lines) + "\n")


USER_PINNED = {"tokenizer": "5ead43b558a2e97d4e2b148eade08a50b42503a2e455e2051740be029c1c2d51",
               "train": "abcd8aaeade4ad06660bf730d33b02f8f4044c939a279cb5f4f26856531ca646",
               "val": "3a58d930c1cd57ac948f8ae7706f562d08cd511f01ce47f071d8b6fd3a2f5293",
               "test": "28435d2516daed6153639da91a3e5b07ee30c5f77bc16029ede89b7e2663eff1"}


def test_user_data_with_long_test_is_byte_identical(tmp_path):
    user_jsonl(tmp_path / "docs.jsonl")
    m = prepare_corpus("mine", tmp_path, from_path=tmp_path / "docs.jsonl", vocab_size=300, progress=False,
                       long_test=2, long_test_tokens=500)
    assert m["cleaning"]["duplicates_dropped"] == 1 and m["long_test"]["reserved_docs_ge_min_tokens"] == 2
    assert m["fingerprint"] == USER_PINNED
