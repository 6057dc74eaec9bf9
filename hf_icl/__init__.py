"""hf_icl: a HuggingFace-native library for in-context learning research."""

__version__ = "0.1.0"

from .data.tasks import available_tasks, get_task, make_task  # noqa: E402
