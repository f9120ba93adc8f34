"""What lenx shows of its results, computed from result files alone: every table, the comparison of
methods over seeds and documents, and every figure.

Tables: one model rendered with rich for a person or as GitHub markdown for results.md, che.md and
REPORT files (tables.py), and the lines a command prints beside them; a builder module per subject
(eval_tables, compare_tables, bench_tables, che_tables, list_tables) turns result dicts into
tables.Table objects. The JSON that machines read is the result dicts themselves, written where they
are computed; corpus_summary.py prints a corpus manifest's. `lenx compare` (compare.py) pools runs'
eval.json over seeds with intervals over documents and seeds (stats.py); plot.py draws every figure
from JSON on disk (`lenx plot`).

Imports: the standard library, numpy, scipy and matplotlib (compare, stats, plot), rich inside the
rich renderer, lenx.fileio, and the evaluation files' names (lenx.evaluation.files); the CHE task
registry (lenx.tasks) and, for `lenx list`, the attention registry and its backends, inside the
functions that name them; plot.py re-draws a CHE folder with lenx.che.protocol, inside its function.
Never the trainer, models, checkpoints, corpora or evaluation itself: a report reads results only.
"""
