"""`lenx eval --hf` at long lengths on a GPU: a randomly initialised Llama with YaRN in its config
(bfloat16, saved with a tokenizer of its own, so the windows are re-tokenized) and one with the
corpus's tokenizer, on a generated text corpus with documents long enough for every window; reports
the time and the peak GPU memory per evaluation, and checks the results are finite. Nothing is
downloaded (transformers must be installed: pip install 'lenx[hf]').

Usage (repository root on a CUDA machine):
  PYTHONPATH=src python3 scripts/device/hf_eval_long.py --lengths 4096,8192,16384,32768 -o $OUT/hf_eval_long.json
  PYTHONPATH=src python3 scripts/device/hf_eval_long.py --small   # the same on the CPU, tiny (a check of the script)
"""

import argparse
import json
import math
from pathlib import Path
import sys
import tempfile
import time

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))  # the tests' model and corpus builders
from hf_helpers import UNICODE, WORDS, corpus_texts, corpus_tokenizer, own_tokenizer  # noqa: E402

from lenx.evaluation.hf_eval import evaluate_hf  # noqa: E402


def corpus(root: Path, words_per_doc: int, docs: int):
    from lenx.data import open_corpus
    from lenx.data.build import prepare_corpus

    src = root / "texts"
    src.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for i in range(docs):
        (src / f"doc{i:03d}.txt").write_text(" ".join(rng.choice(WORDS + UNICODE, words_per_doc)) + ".\n")
    prepare_corpus("long", root, from_path=src, vocab_size=2000, progress=False, val_frac=0.1, test_frac=0.3)
    return open_corpus("long", root)


def llama(path: Path, tokenizer, hidden: int, layers: int, train_len: int, factor: float) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=4 * hidden,
                         num_hidden_layers=layers, num_attention_heads=max(1, hidden // 64),
                         max_position_embeddings=int(train_len * factor), bos_token_id=None,
                         eos_token_id=tokenizer.eos_token_id,
                         rope_scaling={"rope_type": "yarn", "factor": factor,
                                       "original_max_position_embeddings": train_len})
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", default="4096,8192,16384,32768")
    ap.add_argument("--windows", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--small", action="store_true", help="a tiny run on the CPU")
    ap.add_argument("-o", "--out", type=Path, default=None)
    args = ap.parse_args()
    lengths = [int(x) for x in args.lengths.split(",")]
    device = "cpu" if args.small else "cuda"
    if args.small:
        lengths, args.windows, args.hidden, args.layers = [128, 256], 2, 64, 1
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        c = corpus(tmp / "data", words_per_doc=max(lengths) + 2000, docs=30)
        train_len = max(64, lengths[0] // 2)
        models = {"llama-yarn-own-tokenizer": own_tokenizer(corpus_texts(c), vocab_size=2000),
                  "llama-yarn-corpus-tokenizer": corpus_tokenizer(c)}
        for name, tok in models.items():
            folder = llama(tmp / name, tok, args.hidden, args.layers, train_len, max(lengths) / train_len)
            if device == "cuda":
                torch.cuda.reset_peak_memory_stats()
            t0 = time.perf_counter()
            r = evaluate_hf(folder, corpus="long", data_root=tmp / "data", lengths=lengths, windows=args.windows,
                            scored=256 if not args.small else 32, device=device, progress=False, write=False)
            seconds = time.perf_counter() - t0
            peak = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None
            ok = all(math.isfinite(row["ppl"]) and math.isfinite(row["bpb"]) for row in r["results"].values())
            rows.append({"model": name, "dtype": r["dtype"], "same_as_corpus": r["tokenizer"]["same_as_corpus"],
                         "seconds": round(seconds, 1), "peak_gib": peak, "finite": ok, "window_note": r["window_note"],
                         "results": {L: {k: row[k] for k in ("ppl", "bpb", "delta_p") if k in row}
                                     | {"model_tokens_read": max(row["input_tokens"])}
                                     for L, row in r["results"].items()}})
            print(json.dumps(rows[-1]), flush=True)
    if args.out is not None:
        args.out.write_text(json.dumps({"device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
                                        "lengths": lengths, "rows": rows}, indent=2) + "\n")
    if not all(row["finite"] for row in rows):
        sys.exit(1)


if __name__ == "__main__":
    main()
