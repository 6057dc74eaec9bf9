"""hf_icl: a HuggingFace-native library for in-context learning research.

Importing it registers every ICL config / model with transformers' Auto classes.
"""

__version__ = "0.1.0"

from .attention import enable_cab  # noqa: E402  (importing registers the "cab" attention implementation)
from .data.tasks import available_tasks, get_task, make_task  # noqa: E402
from .estimators import available_estimators, get_estimator  # noqa: E402
from .evaluation import evaluate_context_scaling, evaluate_task_scaling, ood_task  # noqa: E402
from .modeling import *  # noqa: E402, F403  (the configs, models and builders: hf_icl.modeling.__all__)
from .training import ICLTrainer, ICLTrainingArguments, train  # noqa: E402
