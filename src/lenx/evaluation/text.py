"""The text of corpus windows: bytes per token, and the same text in another model's tokens.

A prepared corpus keeps token streams of its byte-level BPE (lenx.data), so each corpus token is a
fixed byte string (EOS none: a document break). That gives every evaluation window its bytes, which
makes perplexities of models with different tokenizers comparable per byte, and lets a model with
its own tokenizer (`lenx eval --hf`) read the very text of a window:

- `SameTokens`: the model's tokenizer is the corpus's (same vocabulary, merges and pre-tokenizer):
  it reads the corpus's ids as they are, so its numbers are lenx's own protocol, token for token.
- `Retokenized`: any other tokenizer. The window's bytes are decoded to text once (a character cut
  by the window's first or last corpus token is left out), each document piece is encoded with the
  model's tokenizer, and document breaks become the model's EOS. A region "from corpus token i"
  (where a length's input starts, the scored tokens, ΔP's tokens) is the model tokens that start at
  or after corpus token i's first byte; a model token that starts before it belongs to the text
  before. So the input at every length is a suffix of the longest one's, as lenx's windows are
  nested, and the same model tokens are scored at every length.

Either gives a `ModelText` per window: the model's ids, where each corpus token's region starts,
and the bytes the model tokens from there cover.
"""

from dataclasses import dataclass

import numpy as np

from ..data import DataError


def _byte_level_table() -> dict[str, int]:
    """The byte each character of byte-level BPE stands for: the printable Latin-1 bytes are
    themselves, every other byte the character 256 + its rank among them (GPT-2's mapping)."""
    printable = {*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)}
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[chr(b)] = b
        else:
            table[chr(256 + extra)] = b
            extra += 1
    return table


def token_bytes(corpus) -> list[bytes]:
    """The bytes of every token id of a text corpus's tokenizer; EOS (and any other special token)
    has none. A DataError for a token-level corpus or a tokenizer that is not byte-level BPE."""
    tok = corpus.tokenizer()
    if tok is None:
        raise DataError(f"corpus {corpus.name!r} is token-level: it has no text to measure in bytes or to "
                        "read with another tokenizer")
    table = _byte_level_table()
    special = {i for i, t in tok.get_added_tokens_decoder().items() if t.special} | {corpus.eos_id}
    out = []
    for i in range(tok.get_vocab_size()):
        piece = tok.id_to_token(i)
        if i in special or piece is None:
            out.append(b"")
            continue
        try:
            out.append(bytes(table[ch] for ch in piece))
        except KeyError:
            raise DataError(f"corpus {corpus.name!r}'s tokenizer is not byte-level BPE (token {i} is {piece!r}); "
                            "lenx cannot recover the bytes of its windows") from None
    return out


def byte_lengths(corpus) -> np.ndarray:
    """int64 [vocab]: how many bytes each token id stands for (0 for EOS)."""
    return np.array([len(b) for b in token_bytes(corpus)], dtype=np.int64)


def tail_bytes(lengths: np.ndarray, windows: np.ndarray, tail: int) -> list[int]:
    """The bytes of the last `tail` tokens of every window ([N, n] corpus ids)."""
    return lengths[np.asarray(windows[:, -tail:], dtype=np.int64)].sum(1).tolist()


@dataclass
class ModelText:
    """A corpus window as a model reads it. ids: the model's token ids [m]; first[i]: the index of
    the first model token of the region from corpus token i (i = 0..n; first[n] == m);
    byte_start[j]: the byte of the window where model token j starts ([m + 1], the last the end)."""

    ids: np.ndarray
    first: np.ndarray
    byte_start: np.ndarray

    def bytes_from(self, j: int) -> int:
        """The bytes that the model tokens from index j to the end cover."""
        return int(self.byte_start[-1] - self.byte_start[min(j, len(self.ids))])


class SameTokens:
    """The model reads the corpus's own token ids."""

    same = True

    def __init__(self, corpus, lengths: np.ndarray):
        self.corpus, self.lengths = corpus, lengths

    def convert(self, window: np.ndarray) -> ModelText:
        window = np.asarray(window, dtype=np.int64)
        starts = np.concatenate([[0], np.cumsum(self.lengths[window])])
        return ModelText(window, np.arange(len(window) + 1), starts)

    def encode(self, text: str) -> np.ndarray:
        return np.array(self.corpus.encode(text), dtype=np.int64)

    def decode(self, ids) -> str:
        return self.corpus.decode(ids)


def _whole_characters(raw: bytes, cut_start: bool, cut_end: bool) -> tuple[int, int]:
    """(first, end) byte of the whole UTF-8 characters of raw: leading continuation bytes (a
    character cut by the window's start) and a trailing character cut short (by its end) left out."""
    first, end = 0, len(raw)
    if cut_start:
        while first < end and raw[first] & 0xC0 == 0x80:
            first += 1
    if cut_end:
        lead = end - 1
        while lead >= first and raw[lead] & 0xC0 == 0x80 and end - lead < 4:
            lead -= 1
        if lead >= first and raw[lead] >= 0xC0:
            need = 2 if raw[lead] < 0xE0 else 3 if raw[lead] < 0xF0 else 4
            if end - lead < need:
                end = lead
    return first, end


def _characters(raw: bytes) -> tuple[str, np.ndarray]:
    """The text of UTF-8 bytes and the byte where each of its characters starts (one more: the end).
    A byte that is no part of a whole character (where a retrieval input joins two cuts of the
    stream inside a character) becomes one U+FFFD."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        escaped = raw.decode("utf-8", errors="surrogateescape")  # one lone surrogate per bad byte
        sizes = [1 if "\udc80" <= ch <= "\udcff" else len(ch.encode("utf-8")) for ch in escaped]
        text = "".join("\ufffd" if "\udc80" <= ch <= "\udcff" else ch for ch in escaped)
        return text, np.concatenate([[0], np.cumsum(sizes)])
    arr = np.frombuffer(raw, dtype=np.uint8)
    return text, np.append(np.flatnonzero(arr & 0xC0 != 0x80), len(arr))


class Retokenized:
    """The model reads the text of a window in its own tokens (the module docstring says how)."""

    same = False

    def __init__(self, corpus, tokenizer, table: list[bytes]):
        self.corpus, self.tokenizer, self.table = corpus, tokenizer, table
        self.lengths = np.array([len(b) for b in table], dtype=np.int64)

    def encode(self, text: str) -> np.ndarray:
        return np.array(self.tokenizer(text, add_special_tokens=False)["input_ids"], dtype=np.int64)

    def decode(self, ids) -> str:
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=False)

    def _piece(self, raw: bytes, at: int, cut_start: bool, cut_end: bool):
        """Model ids and start bytes (from the window's start) of one document piece at byte `at`."""
        first, end = _whole_characters(raw, cut_start, cut_end)
        if first == end:
            return [], [], at + end
        text, char_byte = _characters(raw[first:end])
        enc = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        starts = [at + first + int(char_byte[min(s, len(char_byte) - 1)]) for s, _ in enc["offset_mapping"]]
        return list(enc["input_ids"]), starts, at + end

    def convert(self, window: np.ndarray) -> ModelText:
        window = np.asarray(window, dtype=np.int64)
        eos = self.corpus.eos_id
        offsets = np.concatenate([[0], np.cumsum(self.lengths[window])])
        breaks = np.flatnonzero(window == eos)
        if len(breaks) and self.tokenizer.eos_token_id is None:
            raise DataError("this window crosses a document break of the corpus, and the model's tokenizer has no "
                            "EOS token to mark it; evaluate at lengths that fit inside single documents")
        ids, starts, end = [], [], 0
        # Sort keys: 2 x the start byte, an EOS (zero width) one less, so it precedes what follows it.
        keys = []
        bounds = [-1, *breaks.tolist(), len(window)]
        for k in range(len(bounds) - 1):
            lo, hi = bounds[k] + 1, bounds[k + 1]
            if k > 0:  # the break itself
                ids.append(self.tokenizer.eos_token_id)
                starts.append(int(offsets[lo - 1]))
                keys.append(2 * int(offsets[lo - 1]) - 1)
            raw = b"".join(self.table[t] for t in window[lo:hi])
            piece_ids, piece_starts, end = self._piece(raw, int(offsets[lo]), k == 0, k == len(bounds) - 2)
            ids += piece_ids
            starts += piece_starts
            keys += [2 * s for s in piece_starts]
        corpus_keys = 2 * offsets - np.append(window == eos, False)
        first = np.searchsorted(np.asarray(keys, dtype=np.int64), corpus_keys, side="left")
        first[-1] = len(ids)
        end = max(end, starts[-1] if starts else 0)
        return ModelText(np.asarray(ids, dtype=np.int64), first, np.asarray(starts + [end], dtype=np.int64))
