"""Small transformers models and text corpora built in the tests (nothing is downloaded): what the
tests of `lenx eval --hf` share."""

from pathlib import Path

import numpy as np

WORDS = ("river stone light north garden paper silver window market orchard the of and a to in is was "
         "lantern harbor meadow quiet copper thunder").split()
UNICODE = "café naïve 日本語 über 🙂 Ωmega".split()


def text_corpus(root: Path, name: str, unicode: bool = False, docs: int = 30):
    """A prepared text corpus of made-up documents (alternately ~150 and ~900 words), with some
    multi-byte characters when `unicode`; its test split has 9 documents."""
    from lenx.data import open_corpus
    from lenx.data.build import prepare_corpus

    src = Path(root) / f"{name}-texts"
    src.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    words = WORDS + (UNICODE if unicode else [])
    for i in range(docs):
        (src / f"doc{i:02d}.txt").write_text(" ".join(rng.choice(words, 900 if i % 3 else 150)) + ".\n")
    prepare_corpus(name, Path(root), from_path=src, vocab_size=300, progress=False, val_frac=0.1, test_frac=0.3)
    return open_corpus(name, Path(root))


def corpus_tokenizer(corpus):
    """The corpus's own tokenizer.json as a transformers tokenizer."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_file=str(corpus.root / "tokenizer.json"), eos_token="<|endoftext|>")


def own_tokenizer(texts: list[str], vocab_size: int = 320, eos: str = "<eos>"):
    """A byte-level BPE of its own (not the corpus's), with EOS `eos`, as a transformers tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[eos],
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=eos)


def corpus_texts(corpus, split: str = "train") -> list[str]:
    """The documents of a corpus split as text."""
    tokens, docs = corpus.tokens(split), corpus.docs(split)
    return [corpus.decode(tokens[s:s + n]) for s, n in docs]


def llama_folder(path: Path, tokenizer, rope_scaling: dict | None = None, seed: int = 0,
                 max_positions: int = 64) -> Path:
    """A randomly initialised 2-layer Llama (hidden 32) saved with its tokenizer; rope_scaling as
    transformers takes it, e.g. {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, max_position_embeddings=max_positions, rope_scaling=rope_scaling,
                         bos_token_id=None, eos_token_id=tokenizer.eos_token_id)
    model = LlamaForCausalLM(config)
    with torch.no_grad():  # larger weights than the initialisation: NLLs that differ between models
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return Path(path)


def gpt2_folder(path: Path, tokenizer, n_positions: int = 1024, seed: int = 0) -> Path:
    """A randomly initialised 2-layer GPT-2 (learned positions up to n_positions) with its tokenizer."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=len(tokenizer), n_embd=32, n_layer=2, n_head=2, n_positions=n_positions,
                        bos_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id)
    GPT2LMHeadModel(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return Path(path)
