"""Building a corpus from the user's data takes bounded memory: no pass of the build holds the
documents, so a corpus ten times larger than a memory cap builds within the cap."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from lenx.data.build import prepare_corpus
from lenx.data.build import tokenizing as tok_mod

SRC = Path(__file__).resolve().parents[3] / "src"
MB = 1 << 20

# Runs in a child: a warm-up build of a small corpus (so the imports, the thread pools and the
# buffers of one batch are all there), then the peak RSS a build of the big corpus adds to it.
CHILD = """
import json, resource, sys
from pathlib import Path
from lenx.data.build import prepare_corpus
inputs, root, tok = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
def peak():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
prepare_corpus("warm", root, from_path=inputs / "small", tokenizer=tok, progress=False)
before = peak()
m = prepare_corpus("big", root, from_path=inputs / "big", tokenizer=tok, progress=False)
print(json.dumps({"added": peak() - before, "docs": m["cleaning"]["docs_kept"],
                  "tokens": sum(s["tokens"] for s in m["splits"].values())}))
"""


def documents(n_bytes: int, seed: int, words: list[str]) -> list[str]:
    """Documents of ~2,000 characters of random words (so no two are the same), n_bytes in all."""
    rng = np.random.default_rng(seed)
    text = " ".join(np.array(words)[rng.integers(0, len(words), n_bytes // 5)])
    docs, start = [], 0
    while start < len(text):
        end = text.find(" ", start + 2000)
        end = len(text) if end < 0 else end
        docs.append(text[start:end])
        start = end + 1
    return docs


def shards(folder: Path, n_bytes: int, seed: int, words: list[str]) -> int:
    """Half the documents in one parquet file of a single row group (read page by page), half in a
    JSONL file; returns the number of documents."""
    docs = documents(n_bytes, seed, words)
    folder.mkdir(parents=True)
    half = len(docs) // 2
    pq.write_table(pa.table({"text": docs[:half]}), folder / "a.parquet", row_group_size=half, use_dictionary=False,
                   write_batch_size=64, data_page_size=256 * 1024)
    with open(folder / "b.jsonl", "w") as f:
        f.writelines(json.dumps({"text": t}) + "\n" for t in docs[half:])
    return len(docs)


def test_a_corpus_ten_times_the_memory_cap_builds_within_it(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    cap = 3 * MB
    rng = np.random.default_rng(0)
    words = ["".join(rng.choice(list("abcdefghijklmnopqrstuvwxyz"), rng.integers(2, 9))) for _ in range(2000)]
    # A word-level tokenizer (given with --tokenizer) encodes fast: the test measures reading,
    # cleaning, splitting, encoding and writing; that BPE trains from a stream is tested below.
    tok = Tokenizer(models.WordLevel({"<|endoftext|>": 0, "[UNK]": 1} | {w: i + 2 for i, w in
                                                                         enumerate(dict.fromkeys(words))},
                                     unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(tmp_path / "words.json"))
    shards(tmp_path / "in" / "small", cap, 1, words)
    n_docs = shards(tmp_path / "in" / "big", 10 * cap, 2, words)
    size = sum(p.stat().st_size for p in (tmp_path / "in" / "big").iterdir())
    assert size >= 10 * cap
    env = {**os.environ, "PYTHONPATH": str(SRC),
           # Measure what the build holds, not what allocators keep for reuse: glibc hands freed
           # memory back at once, Arrow allocates with it (its default, mimalloc, keeps ~20 MB of
           # freed pages), and the tokenizer runs two threads, as on the 2 cores of CI.
           "MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "131072", "MALLOC_ARENA_MAX": "2",
           "ARROW_DEFAULT_MEMORY_POOL": "system", "RAYON_NUM_THREADS": "2"}
    out = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path / "in"), str(tmp_path / "data"),
                          str(tmp_path / "words.json")], capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["docs"] == n_docs and result["tokens"] > size // 6
    assert result["added"] < cap, f"the build of {size / MB:.0f} MB added {result['added'] / MB:.1f} MB to the peak"


def test_no_pass_holds_the_documents(tmp_path, monkeypatch):
    """Tokenizer training, token counting and encoding get the texts as a stream (a generator reading
    the source again), never a list."""
    path = tmp_path / "docs.jsonl"
    path.write_text("".join(json.dumps({"text": f"document {i} " + "word " * (i % 50)}) + "\n" for i in range(200)))
    seen = []
    real_train, real_encode = tok_mod.train_bpe, tok_mod.encode_docs

    def train(texts, *args, **kw):
        seen.append(("train", type(texts).__name__))
        return real_train(texts, *args, **kw)

    def encode(tok, texts, *args, **kw):
        seen.append(("encode", type(texts).__name__))
        return real_encode(tok, texts, *args, **kw)

    from lenx.data.build import text as text_mod

    monkeypatch.setattr(tok_mod, "train_bpe", train)
    monkeypatch.setattr(tok_mod, "encode_docs", encode)
    monkeypatch.setattr(text_mod, "encode_docs", encode)
    prepare_corpus("x", tmp_path / "data", from_path=path, vocab_size=300, progress=False, long_test=1,
                   long_test_tokens=20)
    # Train, count tokens for --long-test, train again (the reservation took train documents), encode.
    assert seen == [("train", "generator"), ("encode", "generator"), ("train", "generator"), ("encode", "generator")]
