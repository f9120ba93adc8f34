"""Cleaning documents: normalised text, no empty documents, no duplicates."""

from lenx.data.build.clean import clean_docs, normalise


def test_normalise_and_dedupe():
    docs = [("a", b"Hello\r\nworld\r\n"), ("b", "Hello\nworld\n"), ("c", "  \n\t"), ("d", b"\xff ok"),
            ("e", "\ufeffBOM")]
    out, stats = clean_docs(docs)
    assert [d for d, _ in out] == ["a", "d", "e"]
    assert out[0][1] == "Hello\nworld\n" and out[1][1] == "\ufffd ok" and out[2][1] == "BOM"
    assert stats == {"docs_read": 5, "empty_dropped": 1, "duplicates_dropped": 1,
                     "not_utf8_kept_with_replacements": 1, "docs_kept": 3}
    assert normalise("a\rb") == "a\nb"


def test_the_digest_set_is_a_set():
    import hashlib

    from lenx.data.build.digests import DigestSet

    digests = [hashlib.blake2b(str(i % 3000).encode(), digest_size=16).digest() for i in range(5000)]
    digests += [bytes(16), bytes(15) + b"\x01", b"\x01" + bytes(15), bytes(16)]  # zeros (an empty slot's bytes)
    s, ref = DigestSet(capacity=8), set()
    for d in digests:
        assert s.add(d) == (d not in ref)  # grows from 8 slots through many doublings
        ref.add(d)
    assert len(s) == len(ref) == 3003
    assert all(not s.add(d) for d in ref)
    assert s.nbytes / len(s) <= 2 * 16 / 0.7 + 1  # 16 bytes a slot, at most 70% full
