"""A tokenizer the user gives (`lenx prepare --tokenizer PATH`): a `tokenizers` tokenizer.json, or a
transformers tokenizer folder (its tokenizer.json, or, for a folder without one, the fast tokenizer
transformers builds from its files, offline). The corpus's tokenizer.json is then that tokenizer,
with truncation and padding off (a document is encoded whole).

The corpus needs an end-of-text token between documents: the folder's eos_token (tokenizer_config.json
or special_tokens_map.json), else the first of EOS_NAMES in the vocabulary."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from tokenizers import Tokenizer

from ..errors import DataError
from ..tokenizer import plain_text_mode

EOS_NAMES = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>", "<|eos|>", "[EOS]", "<|end|>", "[SEP]")


def _first_line(e: Exception) -> str:
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__


def _config_eos(folder: Path) -> str | None:
    """The eos_token a transformers tokenizer folder declares, if any."""
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        try:
            eos = json.loads((folder / name).read_text(encoding="utf-8")).get("eos_token")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(eos, dict):
            eos = eos.get("content")
        if isinstance(eos, str) and eos:
            return eos
    return None


def _from_transformers(folder: Path) -> Tokenizer:
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise DataError(f"{folder} holds no tokenizer.json; reading its transformers tokenizer needs transformers: "
                        "pip install 'lenx[hf]'") from None
    try:
        tok = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except Exception as e:  # transformers raises many types; all mean the folder is no tokenizer it reads
        raise DataError(f"cannot load a tokenizer from {folder} ({_first_line(e)}); give a tokenizer.json or a "
                        "transformers tokenizer folder") from e
    backend = getattr(tok, "backend_tokenizer", None)
    if not isinstance(backend, Tokenizer):
        raise DataError(f"the tokenizer in {folder} has no fast (tokenizers) version, which lenx needs; save one "
                        "with a tokenizer.json")
    return backend


def open_tokenizer(spec: str) -> tuple[Tokenizer, dict]:
    """(tokenizer, its manifest record) from a tokenizer.json or a transformers tokenizer folder."""
    path = Path(spec).expanduser()
    if path.is_dir():
        tok = (_load_json(path / "tokenizer.json") if (path / "tokenizer.json").is_file()
               else _from_transformers(path))
        eos = _config_eos(path)
    elif path.is_file():
        tok, eos = _load_json(path), None
    else:
        raise DataError(f"--tokenizer {spec}: no such file or folder; give bpe, gpt2, a tokenizer.json or a "
                        "transformers tokenizer folder")
    tok.no_truncation()
    tok.no_padding()
    vocab = tok.get_vocab(with_added_tokens=True)
    if eos is None:
        eos = next((name for name in EOS_NAMES if name in vocab), None)
    if eos is None or eos not in vocab:
        why = f"its eos_token {eos!r} is not in its vocabulary" if eos else f"it has none of {', '.join(EOS_NAMES)}"
        raise DataError(f"--tokenizer {spec}: lenx needs an end-of-text token between documents, and {why}; add one "
                        "as a special token")
    vocab_size = max(tok.get_vocab_size(with_added_tokens=True), max(vocab.values()) + 1)
    record = {"kind": "file", "source": str(path.resolve()), "sha256": tokenizer_sha256(tok),
              "vocab_size": vocab_size, "eos_id": vocab[eos], "eos_token": eos, "file": "tokenizer.json"}
    return plain_text_mode(tok), record


def _load_json(path: Path) -> Tokenizer:
    try:
        return Tokenizer.from_file(str(path))
    except Exception as e:  # tokenizers raises its own exception types
        raise DataError(f"cannot read {path} as a tokenizers tokenizer.json ({_first_line(e)})") from e


def tokenizer_sha256(tok: Tokenizer) -> str:
    """The SHA-256 of the tokenizer as the corpus saves it: the corpus's params pin it, so a changed
    tokenizer file makes the corpus one prepared with other settings."""
    return hashlib.sha256(tok.to_str().encode("utf-8")).hexdigest()
