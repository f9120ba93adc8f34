"""Synthetic tasks: the CHE benchmark's 15 tasks (`che`: generators, Chomsky levels, chance) and
associative recall (`recall`). Imports nothing from lenx; lenx.che trains on the CHE tasks, and
`lenx list` and the CHE table name them."""

from lenx.tasks.che import TASK_ALIASES, TASKS, Task, UnknownTaskError, get_task
from lenx.tasks.recall import IGNORE_INDEX, sample_recall

__all__ = [
    "IGNORE_INDEX",
    "TASKS",
    "TASK_ALIASES",
    "Task",
    "UnknownTaskError",
    "get_task",
    "sample_recall",
]
