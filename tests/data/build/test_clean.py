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
