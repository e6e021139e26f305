"""Task sets: one task format and the loaders that produce it."""
from coderloo.tasksets.task import Task, TaskFileError, load_jsonl, save_jsonl

__all__ = ["Task", "TaskFileError", "load_jsonl", "save_jsonl"]
