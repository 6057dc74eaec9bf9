"""The stories study's sizes (:class:`StoriesScale`), data (:func:`prepare_data`), models
(:func:`stories_model_fields`, :func:`build_stories_model`) and their training with the package's causal-LM loop
(:func:`~hf_icl.training.lm_training.train_causal_lm`: AdamW, warm-up + cosine, clipping at 1, finiteness checked
every step, manifested checkpoints every tenth of a run, bit-identical resume, ``metrics.json``), reused while the
run's spec is unchanged (:func:`train_or_load`). A run cut short continues from its newest checkpoint.

The models were trained with ``transformers.Trainer`` before: the recipe is the same, but the batch order is not
(epochs of ``torch.randperm`` seeded by the run's seed, not the Trainer's sampler), so the study's numbers (losses,
perplexities, generations, verdicts near a threshold) differ from reports made then; the run spec names the trainer
(:data:`TRAINER`), so cached runs of the Trainer are trained again rather than reused."""

from __future__ import annotations

import hashlib
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from ...data.stories import load_story_corpus, pack_stories, train_story_tokenizer
from ...modeling.gd_transformer import GDLanguageModelConfig, GDTransformerForCausalLM
from ...training.checkpoints import latest_checkpoint, quiet_progress
from ...training.lm_training import CannotResumeError, train_causal_lm
from ...training.manifest import CheckpointError
from ...training.run_cache import read_run, write_run
from ...validation import check_int, one_line
from ..report import log
from .document import DOCUMENT_HEADS, DOCUMENT_WIDTH

#: model name -> its label in the report
MODELS = {"softmax_gd": "Softmax GD", "softmax_gd_ff": "Softmax GD + FF", "transformer": "Transformer (1 layer)"}
#: what trained the runs (in their spec: runs trained by ``transformers.Trainer`` before are not reused)
TRAINER = "hf_icl.train_causal_lm/1"
#: the global gradient norm is clipped to this (transformers.Trainer's default, kept)
MAX_GRAD_NORM = 1.0


@dataclass(frozen=True)
class StoriesScale:
    """Sizes of a run. ``n_stories``: template stories generated (a path or TinyStories: at most that many kept);
    ``vocab_size``: the tokenizer's upper bound (the corpus may support fewer); ``context``: tokens per block, the
    models' context; ``compare_words``: the words of each continuation (and of the validation text after the same
    prompt) that the repetition metrics compare.

    >>> StoriesScale(embed_dim=64, n_heads=4).describe(steps=100).split(";")[0]
    "width d' = 64, 4 heads, context 128 tokens, GD 1 step(s)"
    """

    n_stories: int = 2000
    validation_fraction: float = 0.05
    vocab_size: int = 4096
    embed_dim: int = 128
    n_heads: int = 8
    gd_steps: int = 1
    context: int = 128
    batch_size: int = 16
    steps: int = 600
    learning_rate: float = 2e-3
    warmup_steps: int = 30
    weight_decay: float = 0.0
    curve_points: int = 30
    eval_points: int = 6
    n_prompts: int = 16
    prompt_words: int = 6
    max_new_tokens: int = 100
    temperature: float = 1.0
    compare_words: int = 60
    shown_stories: int = 2
    judged_stories: int = 8

    def __post_init__(self):
        for name, value in asdict(self).items():
            if isinstance(value, int) and name != "warmup_steps":
                check_int(name, value, low=1)
        check_int("warmup_steps", self.warmup_steps, low=0)
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        if not 0 < self.validation_fraction < 1:
            raise ValueError(f"validation_fraction must be in (0, 1), got {self.validation_fraction}")
        if self.embed_dim % self.n_heads:
            raise ValueError(f"embed_dim must be a multiple of n_heads={self.n_heads} (GPT-2), got {self.embed_dim}")

    def describe(self, steps: int | None = None) -> str:
        return (
            f"width d' = {self.embed_dim}, {self.n_heads} heads, context {self.context} tokens, GD {self.gd_steps} "
            f"step(s); tokenizer ≤ {self.vocab_size} tokens; each model {steps or self.steps} steps × "
            f"{self.batch_size} blocks, AdamW {self.learning_rate:g}, {self.warmup_steps} warm-up steps + cosine, "
            f"weight decay {self.weight_decay:g}, no dropout; {self.n_prompts} prompts (the first {self.prompt_words} "
            f"words of validation stories), ≤ {self.max_new_tokens} new tokens, greedy and sampled (temperature "
            f"{self.temperature:g})"
        )


#: the CPU default: 2000 template stories (~250k training tokens; the tokenizer stops at ~1.2k tokens, all the grammar
#: supports), 600 steps per model. Measured on one core of the shared 2-core VM (OMP_NUM_THREADS=1): 5.0 min in all,
#: training 86 s (GD), 147 s (GD + FF) and 61 s (transformer)
CPU = StoriesScale()
#: ``full=True``: the document's width and heads, a longer context, the largest vocabulary the corpus supports (up to
#: GPT-2's 50,257). A GPU run: on one CPU core a step of the three models takes ~17 s (about 14 hours for 3000 steps)
FULL = StoriesScale(
    n_stories=20_000,
    vocab_size=50_257,
    embed_dim=DOCUMENT_WIDTH,
    n_heads=DOCUMENT_HEADS,
    context=256,
    batch_size=32,
    steps=3000,
    learning_rate=1e-3,
    warmup_steps=100,
    n_prompts=32,
    max_new_tokens=200,
    compare_words=120,
)


# -- data and models -----------------------------------------------------------------------------------------------
@dataclass
class StoryData:
    """What all three models train and are evaluated on."""

    description: str
    train_texts: list[str]
    validation_texts: list[str]
    tokenizer: object
    train_blocks: torch.Tensor
    validation_blocks: torch.Tensor
    fingerprint: str


def prepare_data(scale: StoriesScale, corpus: str | Path | None, seed: int) -> StoryData:
    """Load the corpus, train the tokenizer on its train split, pack both splits into ``context``-token blocks."""
    source = "template" if corpus is None else corpus
    loaded = load_story_corpus(
        source, n_stories=scale.n_stories, validation_fraction=scale.validation_fraction, seed=seed
    )
    train_texts, validation_texts = list(loaded["train"]["text"]), list(loaded["validation"]["text"])
    description = loaded["train"].info.description.removesuffix("; train split")
    tokenizer = train_story_tokenizer(train_texts, vocab_size=scale.vocab_size, model_max_length=scale.context)
    digest = hashlib.sha256(tokenizer.backend_tokenizer.to_str().encode())
    for text in (*train_texts, "\x00", *validation_texts):  # the blocks follow from the texts and the tokenizer
        digest.update(text.encode() + b"\x00")
    with _quiet_transformers():  # a story longer than the context is expected here (blocks cut it), no warning
        train_blocks = pack_stories(train_texts, tokenizer, scale.context)
        validation_blocks = pack_stories(validation_texts, tokenizer, scale.context)
    return StoryData(
        description=description,
        train_texts=train_texts,
        validation_texts=validation_texts,
        tokenizer=tokenizer,
        train_blocks=train_blocks,
        validation_blocks=validation_blocks,
        fingerprint=digest.hexdigest()[:16],
    )


def stories_model_fields(scale: StoriesScale, tokenizer) -> dict[str, dict]:
    """``{model name: config fields}``: the same vocabulary, width, heads and context for all three."""
    special = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id}
    special["pad_token_id"] = tokenizer.pad_token_id
    gd = {
        "vocab_size": len(tokenizer),
        "n_positions": scale.context,
        "embed_dim": scale.embed_dim,
        "n_heads": scale.n_heads,
        "n_blocks": scale.gd_steps,
        "kernel": "softmax",
        "normalize_attention": True,
        **special,
    }
    transformer = {
        "vocab_size": len(tokenizer),
        "n_positions": scale.context,
        "n_embd": scale.embed_dim,
        "n_head": scale.n_heads,
        "n_layer": 1,
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
        **special,
    }
    return {"softmax_gd": gd, "softmax_gd_ff": {**gd, "use_feed_forward": True}, "transformer": transformer}


def build_stories_model(name: str, fields: dict) -> torch.nn.Module:
    if name == "transformer":
        from transformers import GPT2Config, GPT2LMHeadModel

        return GPT2LMHeadModel(GPT2Config(**fields))
    return GDTransformerForCausalLM(GDLanguageModelConfig(**fields))


# -- training with the package's causal-LM loop, reused when nothing changed ---------------------------------------
@contextmanager
def _quiet_transformers():
    """Errors only from transformers' loggers while training (no config notes repeated per model)."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)


def training_cadence(scale: StoriesScale, steps: int) -> dict[str, int]:
    """How often a run logs its train curve, scores the validation blocks and writes a checkpoint (the newest one
    kept): ``curve_points`` and ``eval_points`` points over the run, a checkpoint every tenth."""
    return {
        "log_every": max(1, steps // scale.curve_points),
        "eval_every": max(1, steps // scale.eval_points),
        "checkpoint_every": max(1, steps // 10),
    }


def train_model(
    name: str,
    fields: dict,
    data: StoryData,
    scale: StoriesScale,
    steps: int,
    seed: int,
    run_dir: Path,
    resume: bool = False,
):
    """Train one model with :func:`~hf_icl.training.lm_training.train_causal_lm` into ``run_dir`` (on the GPU when
    there is one); returns it and its curve ``{"train": [[step, loss]], "validation": [[step, loss]]}``. ``resume``:
    continue from the newest checkpoint in ``run_dir`` (a run cut short), or train afresh if it is another run's."""
    from transformers import set_seed

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

    def train(resume: bool):
        set_seed(seed)  # the initialisation, before the model exists
        model = build_stories_model(name, fields).to(device)
        with _quiet_transformers():
            return train_causal_lm(
                model,
                data.train_blocks,
                data.validation_blocks,
                steps=steps,
                batch_size=scale.batch_size,
                learning_rate=scale.learning_rate,
                warmup_steps=scale.warmup_steps,
                weight_decay=scale.weight_decay,
                max_grad_norm=MAX_GRAD_NORM,
                seed=seed,
                output_dir=run_dir,
                save_total_limit=1,
                resume=resume,
                log=lambda line: log(f"  {MODELS[name]} {line}"),
                **training_cadence(scale, steps),
            )

    if resume and latest_checkpoint(run_dir) is not None:
        try:
            return train(resume=True)
        except (CannotResumeError, CheckpointError) as err:
            log(f"  not resuming in {run_dir} ({one_line(err)}): training afresh")
    return train(resume=False)


def run_spec(name: str, fields: dict, data: StoryData, scale: StoriesScale, steps: int, seed: int) -> dict:
    """Everything a finished run depends on; a run with an equal spec is reused."""
    training = {k: getattr(scale, k) for k in ("batch_size", "learning_rate", "warmup_steps", "weight_decay")}
    curve = {k: getattr(scale, k) for k in ("curve_points", "eval_points")}
    return {
        "trainer": TRAINER,
        "max_grad_norm": MAX_GRAD_NORM,
        "model": name,
        "fields": fields,
        "data": data.fingerprint,
        "steps": steps,
        "seed": seed,
        **training,
        **curve,
    }


def _load_run(run_dir: Path, spec: dict):
    from transformers import AutoModelForCausalLM

    run = read_run(run_dir, spec)
    if run is None:
        return None
    with quiet_progress():
        model = AutoModelForCausalLM.from_pretrained(run_dir).eval()
    return model, run.record


def train_or_load(name, fields, data, scale, steps, seed, runs_dir: Path, retrain: bool):
    """``(model, curve, reused)``: the finished run in ``runs_dir / name`` when its spec is unchanged (and not
    ``retrain``), else a new one; the curve holds the training time (``"seconds"``) of the run that made it."""
    run_dir = runs_dir / name
    spec = run_spec(name, fields, data, scale, steps, seed)
    loaded = None if retrain else _load_run(run_dir, spec)
    if loaded is not None:
        log(f"reusing {run_dir} (trained with the same spec)")
        return (*loaded, True)
    log(f"training {MODELS[name]}: {steps} steps × {scale.batch_size} blocks of {scale.context} tokens")
    started = time.perf_counter()
    # the model folder (save_pretrained, manifest, metrics.json) is train_causal_lm's; run.json marks it finished
    model, curve = train_model(name, fields, data, scale, steps, seed, run_dir, resume=not retrain)
    seconds = time.perf_counter() - started
    write_run(run_dir, spec, record={**curve, "seconds": seconds})
    return model, {**curve, "seconds": seconds}, False
