"""Write a trained run as a transformers model folder (`lenx export RUN DIR`), and check that it loads.

The folder: config.json (LenxConfig: lenx's [model] section, auto_map to the two code files),
generation_config.json, model.safetensors (every shared weight once), configuration_lenx.py and
modeling_lenx.py (subclasses of lenx.export.hf's classes: loading needs lenx installed), the
corpus's tokenizer as a PreTrainedTokenizerFast folder (tokenizer.json, tokenizer_config.json,
special_tokens_map.json; EOS doubles as the padding token; none for a token-level corpus), with it
a small local lm-eval task (lm_eval_tasks/: lenx_text, which runs offline) and a README.md. It is
written beside DIR and moved into place only once transformers has loaded it and its logits are
the run's.
"""

import json
import os
from pathlib import Path
import shutil
from string import Template

import torch

import lenx

from ..data.tokenizer import EOS_TOKEN
from ..fileio import check_writable_dir, write_json, write_text
from ..model.checkpoint import load_weights, weights_step
from ..runs import open_run_corpus, run_config, run_weights
from .lm_eval_task import write_tasks

MIN_TRANSFORMERS = "5.0"  # the model kwargs of generate() and dataclass configs
CODE = ("configuration_lenx.py", "modeling_lenx.py")
AUTO_MAP = {"AutoConfig": "configuration_lenx.LenxConfig", "AutoModelForCausalLM": "modeling_lenx.LenxForCausalLM"}


class ExportError(RuntimeError):
    """What stops an export; one line saying what to do."""


# The folder's code: lenx's classes under the folder's own module names (so that transformers
# registers them and save_pretrained copies these files). Imports inside try are left out of
# transformers' own check of a remote file's imports, so a missing lenx gets this message.
_IMPORT = """try:
    from lenx.export.hf import $names, require_lenx
except ImportError as e:
    raise ImportError(f"this model's code is lenx's: pip install 'lenx[hf]>=$version' ({e})") from None

require_lenx("$version")

"""
CONFIGURATION = Template('"""The configuration of a lenx model, written by `lenx export`: lenx\'s LenxConfig."""\n\n'
                         + _IMPORT.replace("$names", "LenxConfig as _LenxConfig")
                         + "\nclass LenxConfig(_LenxConfig):\n    pass\n")
MODELING = Template('"""A lenx model, written by `lenx export`: lenx\'s LenxForCausalLM runs it."""\n\n'
                    + _IMPORT.replace("$names", "LenxForCausalLM as _LenxForCausalLM")
                    + "from .configuration_lenx import LenxConfig  # noqa: E402\n\n\n"
                    + "class LenxForCausalLM(_LenxForCausalLM):\n    config_class = LenxConfig\n")
CARD = """# {method} (lenx)

Exported by `lenx export` (lenx {version}) from the run `{run}`, step {step} of {steps}{unfinished}: a
decoder of {params:,} parameters ({n_layer} layers, d_model {d_model}, {n_head} heads) with {method}
attention, trained on {train_len}-token sequences of the corpus `{corpus}`.

Its code is lenx's own: loading it needs lenx (`pip install 'lenx[hf]'`).

```python
from transformers import AutoModelForCausalLM, AutoTokenizer

model = AutoModelForCausalLM.from_pretrained("{folder}", trust_remote_code=True)
{tokenizer_line}
```
{lm_eval}"""
LM_EVAL = """
lm-evaluation-harness, offline, on the small task in `lm_eval_tasks/` (rolling perplexity of a few
paragraphs: a check that the harness reads the model, not a benchmark); other tasks need their data:

```
HF_DATASETS_OFFLINE=1 lm_eval --model hf --model_args pretrained={folder},trust_remote_code=True \\
    --include_path {folder}/lm_eval_tasks --tasks lenx_text --batch_size 1
```
"""


def transformers_classes():
    """lenx.export.hf, or an ExportError saying how to install a transformers it runs on."""
    try:
        import transformers
    except ImportError:
        raise ExportError("lenx export needs transformers: pip install 'lenx[hf]'") from None
    from packaging.version import Version

    if Version(transformers.__version__) < Version(MIN_TRANSFORMERS):
        raise ExportError(f"lenx export needs transformers >= {MIN_TRANSFORMERS}, this is {transformers.__version__}: "
                          "pip install -U 'lenx[hf]'")
    from . import hf

    return hf


def is_export(folder: Path) -> bool:
    """Whether `folder` holds a lenx export (its config.json is a lenx model's)."""
    try:
        config = json.loads((Path(folder) / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and config.get("model_type") == "lenx"


def check_target(out: Path, force: bool) -> None:
    """DIR must be new, an empty folder, or (with force) an earlier export; its parent writable."""
    out = Path(out)
    check_writable_dir(out, "the export folder")
    check_writable_dir(out.absolute().parent, "the folder of the export")
    if out.is_dir() and any(out.iterdir()):
        if not is_export(out):
            raise ExportError(f"{out} is a folder that holds other files: give lenx export a new or empty folder")
        if not force:
            raise ExportError(f"{out} holds an earlier lenx export: --force replaces it")


def export_run(run_dir: Path, out: Path, step: int | None = None, force: bool = False) -> dict:
    """Write the run's model (its last checkpoint, or the weights kept at `step`) as a transformers
    folder `out`, checked to load and give the run's logits. Returns what was written."""
    run_dir, out = Path(run_dir), Path(out)
    cfg = run_config(run_dir)
    weights = run_weights(run_dir, step)
    check_target(out, force)
    hf = transformers_classes()
    corpus = open_run_corpus(run_dir, cfg)
    # the run's folder name, not its path: the folder is made to be shared
    last = weights_step(run_weights(run_dir)) if step is not None else weights_step(weights)
    source = {"run": run_dir.absolute().name, "step": weights_step(weights), "steps": cfg.train.steps,
              "finished": last is not None and last >= cfg.train.steps, "corpus": corpus.name}
    config = hf.config_for(cfg.model, version=lenx.__version__, train_len=cfg.train.seq_len, eos_id=corpus.eos_id,
                           source=source, auto_map=AUTO_MAP)
    model = hf.LenxForCausalLM(config).eval()
    load_weights(model.model, weights)
    tokenizer = corpus.root / "tokenizer.json" if corpus.tokenizer() is not None else None
    parent = out.absolute().parent
    created = [p for p in (parent, *parent.parents) if not p.exists()]  # deepest first
    tmp = parent / f"{out.name}.partial-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)  # left by an export that was killed
    try:
        tmp.mkdir(parents=True)
        write_folder(model, tmp, tokenizer, card=card(model, cfg, source, out, tokenizer is not None))
        if tokenizer is not None:  # lm-eval needs a tokenizer
            write_tasks(tmp / "lm_eval_tasks")
        check_folder(tmp, model.model)
        _swap(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        for p in created:  # a failed export leaves no folder it made
            if p.is_dir() and not any(p.iterdir()):
                p.rmdir()
        raise
    return {"run": str(run_dir), "folder": str(out), "method": cfg.model.label, "step": source["step"],
            "steps": source["steps"], "finished": source["finished"],
            "parameters": model.model.num_params(), "tokenizer": tokenizer is not None,
            "files": sorted(p.name for p in out.iterdir())}


def write_folder(model, folder: Path, tokenizer_file: Path | None, card: str = "") -> None:
    """Write a LenxForCausalLM (`model`, its config with auto_map) into the existing `folder`."""
    from safetensors.torch import save_file
    from transformers import GenerationConfig

    folder = Path(folder)
    config = model.config
    config.save_pretrained(folder)
    eos = config.eos_token_id
    GenerationConfig(eos_token_id=eos, pad_token_id=eos).save_pretrained(folder)
    tied = model._tied_weights_keys
    tensors = {k: v.detach().contiguous() for k, v in model.state_dict().items() if k not in tied}
    step = (config.lenx_source or {}).get("step")
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt", "step": str(step)})
    # safetensors creates its file readable by its owner only; a model folder is made to be shared
    os.chmod(folder / "model.safetensors", (folder / "config.json").stat().st_mode & 0o777)
    version = config.lenx_version
    write_text(folder / "configuration_lenx.py", CONFIGURATION.substitute(version=version))
    write_text(folder / "modeling_lenx.py", MODELING.substitute(version=version))
    if tokenizer_file is not None:
        write_tokenizer(folder, tokenizer_file)
    if card:
        write_text(folder / "README.md", card)


def write_tokenizer(folder: Path, tokenizer_file: Path) -> None:
    """The corpus's tokenizer.json as a PreTrainedTokenizerFast folder. A literal <|endoftext|> in a
    text stays text (split_special_tokens), as lenx encodes documents."""
    shutil.copyfile(tokenizer_file, folder / "tokenizer.json")
    # EOS pads too, as generation_config's pad_token_id says: a batch of prompts pads with it
    write_json(folder / "tokenizer_config.json", {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": EOS_TOKEN,
                                                  "pad_token": EOS_TOKEN, "split_special_tokens": True,
                                                  "clean_up_tokenization_spaces": False,
                                                  "model_input_names": ["input_ids", "attention_mask"]})
    write_json(folder / "special_tokens_map.json", {"eos_token": EOS_TOKEN, "pad_token": EOS_TOKEN})


def card(model, cfg, source: dict, out: Path, has_tokenizer: bool) -> str:
    """The folder's README.md: what the model is and how to load it."""
    tok = (f'tokenizer = AutoTokenizer.from_pretrained("{out}", trust_remote_code=True)' if has_tokenizer else
           "# a token-level corpus: the model reads token ids, and the folder has no tokenizer")
    m = cfg.model
    unfinished = "" if source["finished"] else " (the run had not finished training)"
    return CARD.format(method=m.label, version=lenx.__version__, run=source["run"], step=source["step"],
                       steps=source["steps"], unfinished=unfinished, params=model.model.num_params(),
                       n_layer=m.n_layer, d_model=m.d_model, n_head=m.n_head, train_len=cfg.train.seq_len,
                       corpus=source["corpus"], folder=out, tokenizer_line=tok,
                       lm_eval=LM_EVAL.format(folder=out) if has_tokenizer else "")


@torch.no_grad()
def check_folder(folder: Path, lm, length: int = 32, tol: float = 1e-5) -> None:
    """Load `folder` as users do (AutoModelForCausalLM, trust_remote_code) and compare its logits on
    `length` tokens with those of lenx's model `lm`; an ExportError when they differ."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging

    bar = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()
    try:
        loaded = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True).eval()
    except Exception as e:  # whatever this transformers raises, the export is not usable with it
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise ExportError(f"transformers cannot load the exported folder ({type(e).__name__}: {first}); "
                          "nothing was written") from None
    finally:
        if bar:
            logging.enable_progress_bar()
    idx = torch.randint(0, lm.cfg.vocab_size, (1, length), generator=torch.Generator().manual_seed(0))
    want = lm(idx)[0]
    err = float((loaded(idx).logits - want).abs().max() / want.abs().max().clamp(min=1e-6))
    if not err <= tol:
        raise ExportError(f"the exported model's logits differ from the run's (relative error {err:.1e}); "
                          "nothing was written")


def _swap(tmp: Path, out: Path) -> None:
    """Move the finished folder `tmp` to `out`, replacing an earlier export (or an empty folder) there."""
    old = out.absolute().parent / f".{out.name}.old-{os.getpid()}"
    if out.exists():
        os.replace(out, old)
    os.replace(tmp, out)
    shutil.rmtree(old, ignore_errors=True)
