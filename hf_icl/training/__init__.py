"""Accelerate training of ICL models: arguments, curriculum, checkpoints, the loop, model cards, seed stacks."""

from .arguments import ICLTrainingArguments
from .checkpoints import latest_checkpoint
from .curriculum import Curriculum, Schedule
from .manifest import CheckpointError
from .model_card import write_model_card
from .resume import TrainingDivergedError
from .run_lock import OutputDirError
from .seed_stack import SeedStackResult, SeedStackTrainer, train
from .trainer import ICLTrainer, TrainingResult
