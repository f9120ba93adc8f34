"""The tokenizer of a prepared corpus (its tokenizer.json), as training and evaluation load it.

lenx.data.build.tokenizing makes one: byte-level BPE trained on the corpus, or GPT-2's.
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer

EOS_TOKEN = "<|endoftext|>"


def plain_text_mode(tok: Tokenizer) -> Tokenizer:
    """Encode a literal "<|endoftext|>" inside a document as ordinary text, never as EOS."""
    tok.encode_special_tokens = True
    return tok


def load_tokenizer(path: Path) -> Tokenizer:
    return plain_text_mode(Tokenizer.from_file(str(path)))
