"""Building a text corpus from its cleaned documents: split by document, train its tokenizer on the
train split, encode and write every split.

The documents are read as a stream, once per pass (lenx.data.build.scan): training reads the train
split's, encoding reads them all in the order of their source and spools each split's token ids
(writer.Spool), which are then written in the split's own seeded order. What is held is a few
numbers per document, never the texts."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from ..layout import SPLITS, dtype_for_vocab, index_file
from .fetch import Registries
from .scan import Documents
from .splits import (
    LONG_TEST_TOKENS,
    drop_from_splits,
    reserve_long_docs,
    split_docs,
    split_docs_reserving,
    split_members,
    too_few_long,
)
from .tokenizing import count_tokens, encode_docs, make_tokenizer
from .writer import LONG, Spool, write_split


def build_text(folder: Path, name: str, docs: Documents, tokenizer: str, vocab_size: int, seed: int,
               val_frac: float, test_frac: float, reg: Registries, progress: bool, long_test: int = 0,
               long_test_tokens: int = LONG_TEST_TOKENS) -> dict:
    """Write the tokenizer and the splits of the documents `docs` into `folder`; return the
    manifest's "tokenizer", "splits", "token_dtype" and (with `long_test`) "long_test" entries.

    The documents `docs.drop` (the non-text ones) are dealt into splits with the others, then left
    out of theirs, so every other document is where it would be without them (splits.drop_from_splits)."""
    drop = docs.drop
    fixed = tokenizer != "bpe"  # GPT-2's or the user's: not trained here
    # 1. Reserve long documents for test (by tokens). BPE is trained on the train split, which
    # the reservation changes, so tokens are first counted with the BPE of the split without a
    # reservation (GPT-2's tokenizer is fixed: its counts are final), and the final counts are
    # checked after packing.
    lengths = docs.lengths
    reserved, counter, extra = np.zeros(0, dtype=np.int64), None, {}
    if long_test:
        unreserved = drop_from_splits(split_members(split_docs(lengths, seed, val_frac, test_frac), seed), drop,
                                      val_frac, test_frac)
        counter = make_tokenizer(tokenizer, docs, unreserved["train"], vocab_size, reg, progress)
        counted_with = ("tokens counted with GPT-2's tokenizer" if tokenizer == "gpt2" else
                        f"tokens counted with the tokenizer {tokenizer}" if fixed else
                        "tokens counted with the BPE of the split without --long-test")
        counts = count_tokens(counter[0], docs, progress)
        text_counts = counts.copy()
        text_counts[drop] = 0  # non-text documents are never reserved
        # Drawn as without the filter, so the splits stay as they were, unless that draws a non-text
        # document: then among the text documents alone.
        reserved = None
        if (text_counts >= long_test_tokens).sum() >= long_test:
            reserved = reserve_long_docs(name, counts, long_test, long_test_tokens, seed, counted_with)
        if reserved is None or np.isin(reserved, drop).any():
            reserved = reserve_long_docs(name, text_counts, long_test, long_test_tokens, seed, counted_with)
        extra = {"reserved_docs": int(long_test), "min_tokens": int(long_test_tokens),
                 "corpus_docs_ge_min_tokens": int((text_counts >= long_test_tokens).sum()),
                 "counted_with": counted_with}

    # 2. Split by document; within a split, a seeded random order mixes the stream.
    assign = split_docs_reserving(lengths, reserved, seed, val_frac, test_frac)
    members = drop_from_splits(split_members(assign, seed), drop, val_frac, test_frac)

    # 3. Tokenizer: trained on the train split only (or GPT-2's).
    if counter is not None and (fixed or np.array_equal(members["train"], unreserved["train"])):
        tok, tok_record = counter
    else:
        tok, tok_record = make_tokenizer(tokenizer, docs, members["train"], vocab_size, reg, progress)
    eos_id = tok_record["eos_id"]
    tok.save(str(folder / "tokenizer.json"))

    # 4. Encode every document in the order of its source, spooling each split's token ids, then
    # write each split in its own order (members).
    dtype = dtype_for_vocab(tok_record["vocab_size"])
    long = LONG + ((int(long_test_tokens),) if long_test and long_test_tokens not in LONG else ())
    split_of = np.full(len(docs), -1, dtype=np.int8)
    for i, split in enumerate(SPLITS):
        split_of[members[split]] = i
    chosen = np.flatnonzero(split_of >= 0)
    splits = {}
    with Spool(folder, "train", dtype) as train, Spool(folder, "val", dtype) as val, \
            Spool(folder, "test", dtype) as test:
        spools = (train, val, test)
        with tqdm(total=int(lengths[chosen].sum()), desc="encoding", unit="char", unit_scale=True,
                  disable=not progress) as bar:
            for i, ids in zip(chosen, encode_docs(tok, docs.texts(chosen), dtype), strict=True):
                spools[split_of[i]].add(ids)
                bar.update(int(lengths[i]))
        for split, spool in zip(SPLITS, spools, strict=True):
            order = members[split]
            # A spool holds its split's documents in the source's order, which is sorted by number.
            splits[split] = write_split(folder, split, spool.replay(np.searchsorted(np.sort(order), order)),
                                        eos_id, long, dtype)
            splits[split]["chars"] = int(lengths[order].sum())
    out = {"tokenizer": tok_record, "token_dtype": dtype, "splits": splits}
    if long_test:
        # 5. With the final tokenizer's counts, test must hold long_test documents that long.
        test_lens = np.load(index_file(folder, "test"))[:, 1]
        reached = int((test_lens[np.isin(members["test"], reserved)] >= long_test_tokens).sum())
        have = int((test_lens >= long_test_tokens).sum())
        if have < long_test:
            raise too_few_long(name, long_test, long_test_tokens,
                               f"has only {have} in its test split with the tokenizer trained on the final "
                               f"train split ({reached} of the reserved ones reach it there; try another --seed)")
        out["long_test"] = extra | {"reserved_docs_ge_min_tokens": reached}
    return out
