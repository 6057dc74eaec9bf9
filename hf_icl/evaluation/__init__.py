"""Context-scaling evaluation: per-position errors of models and estimators on ICL prompts."""

from .compare import compare_on_task, error_by_position, markdown_table

__all__ = ["compare_on_task", "error_by_position", "markdown_table"]
