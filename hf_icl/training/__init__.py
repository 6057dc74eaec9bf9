"""Accelerate training of ICL models: arguments, curriculum, checkpoints, the loop, model cards."""

from .arguments import ICLTrainingArguments
from .checkpoints import latest_checkpoint
from .curriculum import Curriculum, Schedule
from .manifest import CheckpointError
from .model_card import write_model_card
from .run_lock import OutputDirError
from .trainer import ICLTrainer, TrainingDivergedError, TrainingResult, train
