"""Accelerate training of ICL models: arguments, curriculum, checkpoints, the loop, model cards, seed stacks; and
the causal-LM loop on packed token blocks of the reproductions (:func:`train_causal_lm`)."""

from .arguments import ICLTrainingArguments
from .checkpoints import latest_checkpoint
from .curriculum import Curriculum, Schedule
from .lm_training import train_causal_lm
from .manifest import CheckpointError
from .model_card import write_model_card
from .resume import TrainingDivergedError
from .run_lock import OutputDirError
from .seed_stack import SeedStackResult, SeedStackTrainer, train
from .trainer import ICLTrainer, TrainingResult
