"""The small lm-eval task that `lenx export` writes into an export's lm_eval_tasks/ folder:
lenx_text, a rolling perplexity over a few short paragraphs held in its own Python file, so that
`lm_eval --include_path DIR/lm_eval_tasks --tasks lenx_text` runs with no download (a check that the
harness reads the model, not a benchmark). lm-eval resolves the YAML's `!function` next to it."""

from pathlib import Path

from ..fileio import write_text

TASK = "lenx_text"
YAML = """# A small local lm-eval task that `lenx export` writes beside the model: rolling perplexity over a
# few short English paragraphs (lenx_text.py), so that the harness runs with no download (the model
# folder's README.md gives the lm_eval line). It checks that the harness reads the model; its numbers
# are not a benchmark.
task: lenx_text
custom_dataset: !function lenx_text.load
test_split: test
output_type: loglikelihood_rolling
doc_to_text: ""
doc_to_target: "{{text}}"
metric_list:
  - metric: word_perplexity
  - metric: byte_perplexity
  - metric: bits_per_byte
metadata:
  version: 1.0
"""
DOCUMENTS = '''"""The documents of the lenx_text task (lenx_text.yaml): a few short paragraphs, held here so that
the task needs no download."""

PARAGRAPHS = [
    "The library opens at nine in the morning and closes at six in the evening. On Saturdays it closes at noon.",
    "A small boat crossed the lake before the wind rose. By the time it reached the far shore, the water was grey.",
    "To make the bread, mix the flour with warm water and a little salt, then leave the dough to rest for an hour.",
    "The train was late again, so she read another chapter of her book and watched the rain on the window.",
    "Every function in the module returns a new list; none of them changes the list it was given.",
    "He planted tomatoes along the south wall of the garden, where the sun stays longest in the afternoon.",
    "The meeting moved to Thursday because two of the speakers could not travel on Tuesday.",
    "When the river froze, the children from the village skated on it from morning until the light was gone.",
]


def load(**kwargs):
    """The task's dataset: one split, "test", of the paragraphs (kwargs: lm-eval's metadata, unused)."""
    import datasets

    return datasets.DatasetDict({"test": datasets.Dataset.from_dict({"text": PARAGRAPHS})})
'''


def write_tasks(folder: Path) -> None:
    """The lenx_text task (its YAML and its documents' Python file) into the new folder `folder`."""
    folder = Path(folder)
    folder.mkdir()
    write_text(folder / f"{TASK}.yaml", YAML)
    write_text(folder / f"{TASK}.py", DOCUMENTS)
