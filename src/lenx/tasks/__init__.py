"""Synthetic tasks: the CHE benchmark (`che`) and associative recall (`recall`)."""

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
