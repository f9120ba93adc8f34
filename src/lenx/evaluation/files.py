"""A run's evaluation files: eval.json (and eval_<task>.json, eval_step<N>.json, eval_rope-<scaling>.json)
hold its latest evaluation of that kind; an evaluation they held before with other settings is
kept beside them as <name>.<key>.json, where <key> is a short hash of what it measured (the
checkpoint's step, lengths, windows, scored tokens, split, seeds, depths, samples, RoPE scaling,
corpus fingerprint). `lenx eval` never overwrites an evaluation: only the same evaluation again
(same settings, same checkpoint) replaces itself.

`lenx compare`, `lenx sweep` and `lenx plot RUN` read the latest files (eval.json); the kept ones
are read only when named (`lenx plot RUN/eval.<key>.json`). No torch here: `lenx compare` and
`lenx plot` import this.
"""

import hashlib
import json
from pathlib import Path
import re
import shutil

from ..fileio import write_json

# what an evaluation measured: an evaluation with the same values is the same one again
KEY_FIELDS = ("corpus_fingerprint", "step", "task", "lengths", "windows", "scored", "split", "eval_seed", "depths",
              "samples", "seed", "rope_scaling")
# what else an evaluation of another kind measured: the model of `lenx eval --hf` (an evaluation
# without these fields keeps the key it always had)
EXTRA_KEY_FIELDS = ("model", "hf_config")
KEPT = re.compile(r"(eval[^.]*)\.([0-9a-f]{8})\.json")


def settings_key(result: dict) -> str:
    """8 hex digits of a hash over what `result` measured (KEY_FIELDS, and EXTRA_KEY_FIELDS where it has them)."""
    what = {key: result.get(key) for key in KEY_FIELDS}
    what |= {key: result[key] for key in EXTRA_KEY_FIELDS if key in result}
    if isinstance(result.get("per_position"), dict):  # binned per position: not the evaluation without it
        what["per_position"] = result["per_position"].get("edges")
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:8]


def is_kept(path: Path) -> bool:
    """Whether `path` is an earlier evaluation kept beside a run's latest one (<name>.<key>.json)."""
    return KEPT.fullmatch(Path(path).name) is not None


def describe(result: dict) -> str:
    """What an evaluation measured, in a few words: its lengths, windows or samples, and step."""
    parts = []
    if isinstance(result.get("lengths"), list):
        parts.append("lengths " + ",".join(str(L) for L in result["lengths"]))
    for key, word in (("windows", "windows"), ("samples", "samples per cell"), ("scored", "scored tokens")):
        if result.get(key) is not None:
            parts.append(f"{result[key]} {word}")
    if result.get("step") is not None:
        parts.append(f"step {result['step']}")
    return ", ".join(parts) or "unknown settings"


def kept_note(path: Path, kept: Path, result: dict) -> str:
    """The note that `path` held another evaluation, now kept as `kept`: of another model (`lenx eval
    --hf` into the same folder), else with other settings (what it measured)."""
    try:
        old = json.loads(Path(kept).read_text())
        what = describe(old)
    except (OSError, ValueError, AttributeError):
        old, what = None, "not a readable evaluation"
    if isinstance(old, dict) and old.get("model") and result.get("model") and old["model"] != result["model"]:
        return f"note: {path} held an evaluation of another model ({Path(str(old['model'])).name}); kept it as {kept}"
    return f"note: {path} held an evaluation with other settings ({what}); kept it as {kept}"


def write_evaluation(path: Path, result: dict) -> Path | None:
    """Write `result` to `path` (atomically). An evaluation already there with other settings (or a
    file there that is not one) is first copied to <name>.<key>.json beside it; returns that path,
    or None when nothing was there or it was the same evaluation, which the new one replaces."""
    path = Path(path)
    kept = None
    if path.exists():
        try:
            old = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, ValueError):
            old = None
        if not isinstance(old, dict):  # not an evaluation: kept under a hash of its bytes
            key = hashlib.sha256(path.read_bytes()).hexdigest()[:8]
        else:
            key = settings_key(old)
        if not isinstance(old, dict) or key != settings_key(result):
            kept = path.with_name(f"{path.stem}.{key}.json")
            shutil.copy2(path, kept)  # a copy, so the latest file is never missing
    write_json(path, result)
    return kept
