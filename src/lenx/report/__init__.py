"""What lenx shows of its results: every table, from one model rendered with rich for a person or
as GitHub markdown for results.md, che.md and REPORT files (tables.py), and the lines a command
prints beside them. The JSON that machines read is the result dicts themselves, written where they
are computed; corpus_summary.py prints a corpus manifest's.

A builder module per subject (eval_tables, compare_tables, bench_tables, che_tables, list_tables)
turns result dicts into tables.Table objects; tables.py renders them.

Imports: the standard library, and rich inside the rich renderer; the CHE task registry
(lenx.tasks) and, for `lenx list`, the attention registry and its backends, inside the functions
that name them. Never the trainer, models, checkpoints or evaluation: a report reads results only.
"""
