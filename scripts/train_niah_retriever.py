"""Train a small GPT-2 that retrieves passkeys from filler text: the model the NIAH harness evaluates.

No pretrained weights can be downloaded here, so we train one. The prompts are exactly the ``NeedleInAHaystack``
builder's (built-in filler, passkey needle, question), at random lengths and depths, with a fresh passkey each time;
the tokenizer is a byte-level BPE trained on those texts with every digit its own token.

    python scripts/train_niah_retriever.py --output-dir runs/niah-retriever            # CPU: up to 1024 tokens
    python scripts/train_niah_retriever.py --output-dir runs/niah-4k --max-length 4096 --device cuda

The loss is next-token cross-entropy on every token (the cycled filler teaches induction-style copying) plus
``--answer-weight`` times the loss on the passkey tokens. Training uses ``transformers.Trainer``; the run ends with
``save_pretrained`` (model + tokenizer), an exact-match evaluation on held-out prompts (greedy generation, dense
attention) and a model card. Reload it with ``AutoModelForCausalLM.from_pretrained(output_dir)``.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from torch.utils.data import IterableDataset, get_worker_info
from tqdm.auto import tqdm
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    PreTrainedTokenizerFast,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

from hf_icl.data.niah import DEFAULT_NEEDLE, DEFAULT_QUESTION, FILLER_SENTENCES, NeedleInAHaystackConfig
from hf_icl.evaluation.niah import greedy_answer
from hf_icl.modeling.model_folder import write_model_manifest

EOS = "<|endoftext|>"


def build_tokenizer(vocab_size: int) -> PreTrainedTokenizerFast:
    """Byte-level BPE over the filler, needle and question texts; digits are never merged (one token each)."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=[EOS], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    corpus = [" " + s for s in FILLER_SENTENCES] + [DEFAULT_NEEDLE.replace("{passkey}", "0123456789"), DEFAULT_QUESTION]
    tokenizer.train_from_iterator(corpus * 20, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=EOS, pad_token=EOS, bos_token=EOS)


class RetrievalPrompts(IterableDataset):
    """Endless NIAH prompts + answers; one length per batch, growing from ``min_length`` to ``max_length``.

    The length cap rises linearly over the first ``ramp_steps`` batches (a curriculum: short prompts teach the
    copying fast, long ones teach the positions); after that lengths are uniform in [min_length, max_length].
    """

    def __init__(self, niah: NeedleInAHaystackConfig, args: argparse.Namespace):
        self.niah, self.args = niah, args

    def length_cap(self, step: int) -> int:
        """The longest prompt of global batch ``step``: the curriculum's linear ramp."""
        args = self.args
        ramp = min(1.0, step / max(args.ramp_steps, 1))
        return int(args.min_length + (args.max_length - args.min_length) * ramp)

    def __iter__(self):
        # Each dataloader worker draws its own stream, and the loader takes batches from the workers in turn:
        # worker w's i-th batch is global batch i * num_workers + w, which is what the ramp must count.
        worker = get_worker_info()
        worker_id, n_workers = (worker.id, worker.num_workers) if worker else (0, 1)
        rng = random.Random(self.args.seed * 1009 + worker_id)
        args = self.args
        for local_step in range(10**12):
            length = rng.randrange(args.min_length, self.length_cap(local_step * n_workers + worker_id) + 1)
            for _ in range(args.batch_size):
                row = self.niah.row(length, rng.random(), rng.randrange(10**9))
                ids = torch.tensor(row["input_ids"] + row["answer_ids"])
                yield {"input_ids": ids, "labels": ids}


def extend_positions(model: GPT2LMHeadModel, n_positions: int) -> None:
    """Grow the learned position table of a model continued at longer lengths: old rows kept, new ones drawn
    like GPT-2's initialisation (the length curriculum then trains them)."""
    old = model.transformer.wpe.weight.data
    new = torch.nn.Embedding(n_positions, old.shape[1])
    new.weight.data.normal_(0.0, model.config.initializer_range)
    new.weight.data[: old.shape[0]] = old
    model.transformer.wpe = new
    model.config.n_positions = n_positions


def retrieval_loss(answer_tokens: int, answer_weight: float):
    """Next-token CE on every position + ``answer_weight`` × CE on the last ``answer_tokens`` (the passkey)."""

    def loss(outputs, labels, num_items_in_batch=None):
        logits = outputs.logits[:, :-1].float()
        targets = labels[:, 1:]
        per_token = F.cross_entropy(logits.transpose(1, 2), targets, reduction="none")
        return per_token.mean() + answer_weight * per_token[:, -answer_tokens:].mean()

    return loss


class TimeLimit(TrainerCallback):
    """Stop training (the model is then saved and evaluated as usual) once ``minutes`` of wall time have passed."""

    def __init__(self, minutes: float):
        self.deadline = time.time() + 60 * minutes

    def on_step_end(self, args, state, control, **kwargs):
        if time.time() > self.deadline:
            print(f"time limit reached after {state.global_step} steps; stopping", flush=True)
            control.should_training_stop = True
        return control


@torch.no_grad()
def exact_match(model, tokenizer, niah: NeedleInAHaystackConfig) -> dict[int, float]:
    """Greedy-generation exact match per context length over every (depth, sample) cell of ``niah``."""
    model.eval()
    hits: dict[int, list[bool]] = {length: [] for length in niah.context_lengths}
    rows = list(niah.rows())
    for row in tqdm(rows, desc="exact match", leave=False):
        answer = greedy_answer(model, tokenizer, row["input_ids"], len(row["answer_ids"]), tokenizer.pad_token_id)
        hits[row["context_length"]].append(answer == row["answer"])
    return {length: sum(h) / len(h) for length, h in hits.items()}


def model_card(args, accuracy: dict[int, float], seconds: float, argv: list[str]) -> str:
    table = "\n".join(f"| {length} | {100 * acc:.1f}% |" for length, acc in accuracy.items())
    return f"""---
library_name: transformers
tags: [hf-icl, needle-in-a-haystack, passkey-retrieval]
---
# NIAH passkey retriever ({args.layers} layers, width {args.width})

A GPT-2 trained from scratch by `hf_icl` to retrieve a {args.digits}-digit passkey hidden in filler text, the
needle-in-a-haystack prompts of `hf_icl.data.builders.NeedleInAHaystack` (built-in filler, default needle and
question), at lengths {args.min_length}–{args.max_length} tokens. It is the model `hf-icl niah` evaluates offline.

Command: `python scripts/train_niah_retriever.py {" ".join(argv)}` ({args.steps} steps, batch {args.batch_size},
lr {args.lr}, {seconds / 60:.1f} min on {args.device}, {time.strftime("%Y-%m-%d")}).

Held-out exact match (greedy generation, dense attention, depths {args.eval_depths},
{args.eval_samples} passkeys per cell, seed {args.seed + 1}):

| context length | exact match |
|---:|---:|
{table}
"""


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output-dir", required=True)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--init-from", default=None, help="continue from a saved retriever (model + tokenizer dir)")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--vocab-size", type=int, default=512)
    parser.add_argument("--digits", type=int, default=5)
    parser.add_argument("--min-length", type=int, default=64)
    parser.add_argument("--max-length", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--ramp-steps", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--answer-weight", type=float, default=1.0)
    parser.add_argument("--eval-lengths", type=int, nargs="+", default=None, help="default: max-length / 4, / 2, / 1")
    parser.add_argument("--eval-depths", type=float, nargs="+", default=[0.0, 0.25, 0.5, 0.75, 1.0])
    parser.add_argument("--eval-samples", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--workers", type=int, default=0, help="dataloader worker processes making prompts")
    parser.add_argument("--max-minutes", type=float, default=None, help="stop training after this much wall time")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.min_length >= args.max_length:
        parser.error(f"--min-length ({args.min_length}) must be below --max-length ({args.max_length})")
    if args.max_minutes is not None and args.max_minutes <= 0:
        parser.error(f"--max-minutes must be positive, got {args.max_minutes}")
    if args.eval_lengths is None:
        args.eval_lengths = sorted({args.max_length // 4, args.max_length // 2, args.max_length})
    return args


def main(argv: list[str] | None = None) -> dict[int, float]:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    out = Path(args.output_dir)
    tokenizer = build_tokenizer(args.vocab_size)
    if args.init_from:
        tokenizer = PreTrainedTokenizerFast.from_pretrained(args.init_from)
    niah = NeedleInAHaystackConfig(
        tokenizer=tokenizer,
        context_lengths=[args.max_length],
        depths=[0.5],
        samples_per_cell=1,
        passkey_digits=args.digits,
        seed=args.seed,
    )
    answer_tokens = len(niah.answer_ids("1" * args.digits))
    config = GPT2Config(
        n_layer=args.layers,
        n_embd=args.width,
        n_head=args.heads,
        n_positions=args.max_length + 16,
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        attn_pdrop=0.0,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
    )
    model = GPT2LMHeadModel.from_pretrained(args.init_from) if args.init_from else GPT2LMHeadModel(config)
    if model.config.n_positions < args.max_length + 16:
        extend_positions(model, args.max_length + 16)
    training = TrainingArguments(
        output_dir=str(out / "checkpoints"),
        max_steps=args.steps,
        per_device_train_batch_size=args.batch_size,
        learning_rate=args.lr,
        warmup_steps=min(50, args.steps // 10),
        lr_scheduler_type="cosine",
        weight_decay=0.01,
        max_grad_norm=1.0,
        logging_steps=max(1, args.steps // 50),
        save_steps=max(1, args.steps // 4),
        save_total_limit=1,
        report_to=[],
        seed=args.seed,
        dataloader_num_workers=args.workers,
        use_cpu=args.device == "cpu",
        bf16=args.device == "cuda",
    )
    trainer = Trainer(
        model=model,
        args=training,
        train_dataset=RetrievalPrompts(niah, args),
        compute_loss_func=retrieval_loss(answer_tokens, args.answer_weight),
        callbacks=[TimeLimit(args.max_minutes)] if args.max_minutes else None,
    )
    start = time.time()
    trainer.train()
    seconds = time.time() - start
    model = trainer.model.float()
    model.config.use_cache = True  # the Trainer turns the KV cache off for training; users expect it on
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    write_model_manifest(out)  # hf_icl's loaders check a folder against it
    held_out = NeedleInAHaystackConfig(
        tokenizer=tokenizer,
        context_lengths=args.eval_lengths,
        depths=args.eval_depths,
        samples_per_cell=args.eval_samples,
        passkey_digits=args.digits,
        seed=args.seed + 1,
    )
    accuracy = exact_match(model, tokenizer, held_out)
    (out / "retrieval_eval.json").write_text(json.dumps({str(k): v for k, v in accuracy.items()}, indent=2))
    (out / "README.md").write_text(model_card(args, accuracy, seconds, argv))
    for length, acc in accuracy.items():
        print(f"exact match @ {length} tokens: {100 * acc:.1f}%")
    return accuracy


if __name__ == "__main__":
    main()
