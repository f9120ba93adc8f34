"""The bytes of corpus tokens, and a window's text in another tokenizer's tokens (lenx.evaluation.text)."""

import numpy as np
import pytest

from hf_helpers import corpus_texts, corpus_tokenizer, own_tokenizer, text_corpus
from lenx.data import DataError
from lenx.evaluation.evaluate import eval_windows_with_documents
from lenx.evaluation.text import Retokenized, SameTokens, _whole_characters, byte_lengths, tail_bytes, token_bytes


@pytest.fixture(scope="module")
def uni(tmp_path_factory):
    return text_corpus(tmp_path_factory.mktemp("data"), "uni", unicode=True)


@pytest.fixture(scope="module")
def other(uni):
    return own_tokenizer(corpus_texts(uni))


def test_token_bytes_give_the_documents_back(uni):
    table = token_bytes(uni)
    assert table[uni.eos_id] == b""
    tokens, docs = uni.tokens("test"), uni.docs("test")
    for start, n in docs:
        ids = tokens[start:start + n]
        assert b"".join(table[i] for i in ids) == uni.decode(ids).encode("utf-8")
    sizes = byte_lengths(uni)
    windows = np.stack([tokens[s:s + 50] for s, _ in docs])
    assert tail_bytes(sizes, windows, 20) == [len(b"".join(table[i] for i in w[-20:])) for w in windows]


def test_a_token_level_corpus_has_no_bytes():
    class TokenLevel:
        name = "synthetic"

        def tokenizer(self):
            return None

    with pytest.raises(DataError, match="token-level"):
        token_bytes(TokenLevel())


@pytest.mark.parametrize("raw, cut_start, cut_end, expected", [
    ("é".encode()[1:] + b"ab", True, False, (1, 3)),           # a character cut by the window's start
    (b"ab" + "é".encode()[:1], False, True, (0, 2)),           # ... and by its end
    (b"ab" + "日".encode()[:2], False, True, (0, 2)),
    (b"ab" + "🙂".encode()[:3], False, True, (0, 2)),
    (b"ab" + "🙂".encode(), False, True, (0, 6)),              # whole characters stay
    ("日".encode()[1:] + b"x" + "日".encode()[:1], True, True, (2, 3)),
    ("é".encode()[1:] + b"ab", False, False, (0, 3)),          # inside a window nothing is cut
])
def test_whole_characters(raw, cut_start, cut_end, expected):
    assert _whole_characters(raw, cut_start, cut_end) == expected


def regions_hold(text, offsets):
    """Every corpus token's region starts at the first model token at or after its first byte."""
    for i, at in enumerate(offsets):
        j = text.first[i]
        assert (text.byte_start[:j] < at).all() or i == len(offsets) - 1
        assert (text.byte_start[j:-1] >= at).all()


def test_retokenized_windows_keep_their_text(uni, other):
    table = token_bytes(uni)
    convert = Retokenized(uni, other, table)
    data, _, _ = eval_windows_with_documents(uni, "test", 300, 8, 3)
    for window in data:
        raw = b"".join(table[t] for t in window)
        text = convert.convert(window)
        first, end = _whole_characters(raw, True, True)
        assert other.decode(text.ids.tolist()).encode() == raw[first:end]  # the same text, whole characters
        assert text.byte_start[-1] == end and text.bytes_from(0) == end - text.byte_start[0]
        offsets = np.concatenate([[0], np.cumsum([len(table[t]) for t in window])])
        regions_hold(text, offsets)
        assert text.first[-1] == len(text.ids) and (np.diff(text.first) >= 0).all()


def test_the_corpus_tokenizer_reads_the_corpus_ids(uni):
    """SameTokens passes the ids on; the corpus's own tokenizer through Retokenized finds the same
    regions at every token boundary where re-encoding gives the same tokens."""
    data, _, _ = eval_windows_with_documents(uni, "test", 200, 4, 5)
    same = SameTokens(uni, byte_lengths(uni)).convert(data[0])
    assert (same.ids == data[0]).all() and (same.first == np.arange(len(data[0]) + 1)).all()
    assert same.bytes_from(150) == len(b"".join(token_bytes(uni)[t] for t in data[0][150:]))
    again = Retokenized(uni, corpus_tokenizer(uni), token_bytes(uni)).convert(data[0])
    assert again.bytes_from(again.first[150]) <= same.bytes_from(150)


def test_document_breaks_become_the_models_eos(uni, other):
    table = token_bytes(uni)
    tokens, docs = uni.tokens("test"), uni.docs("test")
    start, n = docs[1]
    window = np.asarray(tokens[start + n - 40:start + n + 41], dtype=np.int64)  # EOS in the middle
    assert window[40] == uni.eos_id
    text = Retokenized(uni, other, table).convert(window)
    eos = text.first[40]
    assert text.ids[eos] == other.eos_token_id and list(text.ids).count(other.eos_token_id) == 1
    assert text.first[41] == eos + 1  # the next document starts after it
    assert other.decode(text.ids[eos + 1:].tolist()).encode() == b"".join(table[t] for t in window[41:])

    class NoEos:
        eos_token_id = None

    with pytest.raises(DataError, match="no EOS token"):
        Retokenized(uni, NoEos(), table).convert(window)


def test_a_character_split_between_two_cuts_reads_as_one_replacement_per_byte(uni, other):
    """A retrieval input joins cuts of the stream; a character cut at a seam is no text: each of its
    bytes reads as U+FFFD, and the byte positions stay exact."""
    table = token_bytes(uni)
    partial = next(i for i, b in enumerate(table) if b and b[0] >= 0xC0 and len(b) == 1)  # a lead byte alone
    window = np.array(uni.encode(" river stone") + [partial] + uni.encode(" garden light"), dtype=np.int64)
    text = Retokenized(uni, other, table).convert(window)
    assert other.decode(text.ids.tolist()) == " river stone\ufffd garden light"
    offsets = np.concatenate([[0], np.cumsum([len(table[t]) for t in window])])
    assert text.byte_start[-1] == offsets[-1]
    regions_hold(text, offsets)
