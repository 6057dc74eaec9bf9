"""``hf-icl reproduce gd-icl stories``: the functional-GD document's language generation (seed 004).

The document trains, on Tiny Stories + Children Stories (GPT-2's 50,257 tokens, d' = 512, 8 heads), a Softmax GD
language model ("8K attention parameters"), the same with a feed-forward layer (Softmax GD + FF) and a one-layer
transformer ("6M attention parameters"); GPT-4o grades their stories for grammar, consistency, plot and creativity:
GD competes closely with the transformer, GD + FF almost equals it, and both fail mostly by repeating themselves.

Here the three models train with the package's causal-LM loop (:func:`hf_icl.training.train_causal_lm`: checked steps,
manifested checkpoints, resume, metrics.json) on the same blocks of the same corpus and tokenizer:
:class:`~hf_icl.modeling.gd_transformer.GDTransformerForCausalLM` (softmax kernel, ``normalize_attention=True`` as in
the co-author's softmax LM, one GD step), the same with ``use_feed_forward=True``, and a one-layer
``GPT2LMHeadModel`` of the same width, heads and context, all with one recipe (AdamW, warm-up + cosine, no dropout).
What is measured instead of GPT-4o's grades: validation perplexity, and distinct-n and repetition of stories generated
(greedy and sampled) from the first words of validation stories. GPT-4o is not reachable offline; a grader can be
passed as ``judge`` (any ``prompt -> reply`` callable, :mod:`hf_icl.evaluation.story_judge`), and the report names it.

The default corpus is the offline template grammar (:func:`~hf_icl.data.stories.generate_template_stories`): simpler
text than TinyStories, so its numbers do not compare with the document's; ``corpus="tinystories"`` (online) or a
local path trains on real stories. Example (a tiny run)::

    from hf_icl.reproduce.report import Report
    report = Report("gd-icl", "stories", TITLE, "", "", Path("out"))
    stories(report, Path("out/runs"), full=False, retrain=False, steps=20, seed=0, scale=StoriesScale(n_stories=60))
    report.write()
"""

from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from ...evaluation.story_judge import CRITERIA, aggregate_scores, judge_stories
from ...modeling.gd_transformer import attention_parameter_counts
from ...validation import check_int
from ..report import Report, log
from .document import DOCUMENT_HEADS, DOCUMENT_WIDTH
from .stories_claims import (
    document_size_counts,
    generate_continuations,
    judge_claims,
    mean_score,
    parameter_claims,
    perplexity_claims,
    repetition_claim,
    repetition_metrics,
    score_text,
    story_prompts,
    validation_perplexity,
)
from .stories_training import (
    CPU,
    FULL,
    MODELS,
    StoriesScale,
    StoryData,
    prepare_data,
    stories_model_fields,
    train_or_load,
)

TITLE = "language generation: Softmax GD, Softmax GD + FF and a one-layer transformer on stories"


# -- the experiment --------------------------------------------------------------------------------------------------
def stories(
    report: Report,
    runs_dir: Path,
    *,
    full: bool = False,
    retrain: bool = False,
    steps: int | None = None,
    seed: int = 0,
    corpus: str | Path | None = None,
    judge: Callable[[str], str] | None = None,
    judge_name: str = "judge",
    scale: StoriesScale | None = None,
) -> None:
    """Train Softmax GD, Softmax GD + FF and a one-layer transformer on one story corpus and add their comparison to
    ``report``: attention parameter counts, validation perplexity, repetition of generated stories, sample stories,
    training curves, and a verdict on each of the document's claims.

    Args:
        report: the report to fill (its ``size`` is replaced by this experiment's sizes).
        runs_dir: where the trained models live (``runs_dir / "stories" / <model>``, reused when unchanged), and
            their tokenizer (``runs_dir / "stories" / "tokenizer"``).
        full: the document-like sizes (:data:`FULL`) instead of the CPU default (:data:`CPU`).
        retrain: train even when a finished run with the same spec exists.
        steps: training steps of every model (default: the scale's).
        seed: the corpus (template grammar and split), the initialisation, the batch order and the sampling.
        corpus: ``None`` (the offline template grammar), ``"tinystories"`` (the Hub, online) or a local path
            (:func:`~hf_icl.data.stories.load_story_corpus`).
        judge: a ``prompt -> reply`` grader of the sampled stories (:func:`~hf_icl.evaluation.judge_stories`);
            ``None``: the GPT-4o claims are "not testable at this size".
        judge_name: how the report names the judge.
        scale: replaces the sizes altogether (tests).
    """
    scale = scale or (FULL if full else CPU)
    steps = check_int("steps", steps, low=1) if steps is not None else scale.steps
    check_int("seed", seed, low=0)
    if judge is not None and not callable(judge):
        raise ValueError(f"judge must be a callable prompt -> reply or None, got {type(judge).__name__}")
    runs_dir = Path(runs_dir) / "stories"
    data = prepare_data(scale, corpus, seed)
    size = _describe_size(scale, steps, data)
    report.size = size
    report.numbers["stories_scale"] = {**asdict(scale), "steps": steps, "seed": seed}
    log(f"stories: {size}")

    runs_dir.mkdir(parents=True, exist_ok=True)
    data.tokenizer.save_pretrained(runs_dir / "tokenizer")  # the models' tokenizer, beside them
    fields = stories_model_fields(scale, data.tokenizer)
    models, curves, reused = {}, {}, {}
    for name in MODELS:
        models[name], curves[name], reused[name] = train_or_load(
            name, fields[name], data, scale, steps, seed, runs_dir, retrain
        )
    counts = {name: attention_parameter_counts(model) for name, model in models.items()}
    log("validation perplexity")
    perplexity = {name: validation_perplexity(model, data.validation_blocks) for name, model in models.items()}

    prompts = story_prompts(data.validation_texts, scale.n_prompts, scale.prompt_words)
    if not prompts:
        raise ValueError(f"no validation story has more than prompt_words={scale.prompt_words} words")
    beginnings = [prompt for prompt, _ in prompts]
    log(f"generating from {len(prompts)} prompts (greedy and sampled)")
    generations = {
        name: {
            mode: generate_continuations(model, data.tokenizer, beginnings, scale, mode == "sampled", seed)
            for mode in ("greedy", "sampled")
        }
        for name, model in models.items()
    }
    reference = repetition_metrics([rest for _, rest in prompts], scale.compare_words)
    repetition = {
        name: {mode: repetition_metrics(texts, scale.compare_words) for mode, texts in by_mode.items()}
        for name, by_mode in generations.items()
    }
    scores = None
    if judge is not None:
        log(f"grading sampled stories with {judge_name}")
        scores = {
            name: aggregate_scores(
                judge_stories(
                    generations[name]["sampled"][: scale.judged_stories],
                    judge,
                    beginnings=beginnings[: scale.judged_stories],
                )
            )
            for name in MODELS
        }

    _report_counts(report, counts, scale)
    _report_perplexity(report, perplexity, counts, curves, reused)
    _report_repetition(report, repetition, reference, scale)
    if scores is not None:
        _report_scores(report, scores, judge_name)
    _report_samples(report, prompts, generations, scale.shown_stories)
    _plot_curves(report, curves)

    for row in parameter_claims(document_size_counts()):
        report.claim(*row)
    for row in perplexity_claims({name: value[1] for name, value in perplexity.items()}, len(data.tokenizer)):
        report.claim(*row)
    report.claim(*repetition_claim({name: repetition[name]["greedy"] for name in MODELS}, reference))
    for row in judge_claims(scores, judge_name):
        report.claim(*row)
    report.numbers["stories"] = {
        "corpus": data.description,
        "vocab_size": len(data.tokenizer),
        "train_tokens": data.train_blocks.numel(),
        "validation_tokens": data.validation_blocks.numel(),
        "attention_parameters": counts,
        "document_size_counts": document_size_counts(),
        "validation_loss": {name: value[0] for name, value in perplexity.items()},
        "perplexity": {name: value[1] for name, value in perplexity.items()},
        "repetition": repetition,
        "reference_repetition": reference,
        "curves": curves,
        "judge": None if scores is None else {"name": judge_name, "scores": scores},
        "prompts": beginnings,
        "generations": generations,
    }


def _describe_size(scale: StoriesScale, steps: int, data: StoryData) -> str:
    return (
        f"corpus: {data.description}: {len(data.train_texts)} train / {len(data.validation_texts)} validation stories, "
        f"{data.train_blocks.numel():,} / {data.validation_blocks.numel():,} tokens in blocks; byte-level BPE of "
        f"{len(data.tokenizer)} tokens; {scale.describe(steps)}"
    )


# -- report sections -------------------------------------------------------------------------------------------------
def _report_counts(report: Report, counts: dict, scale: StoriesScale) -> None:
    document = document_size_counts()
    lines = [
        f"### Attention parameters (d' = {scale.embed_dim}, {scale.n_heads} heads, this run)",
        "",
        "| model | query/key | value | attention (Q/K/V) | output projections | all but the token embedding |",
        "|---|---|---|---|---|---|",
        *(
            f"| {MODELS[name]} | {c['query_key']:,} | {c['value']:,} | {c['attention']:,} | {c['output']:,} | "
            f"{c['non_embedding']:,} |"
            for name, c in counts.items()
        ),
        "",
        f"At the document's size (d' = {DOCUMENT_WIDTH}, {DOCUMENT_HEADS} heads): Softmax GD {document['gd']:,} "
        f'(the document\'s "8K"); a GPT-2 layer {document["gpt2_layer"]:,}; {DOCUMENT_HEADS} heads with full-width '
        f"Q/K/V {document['full_width_heads']:,} (the document's \"6M\": 3 · 8 · 512²). GD's query/key maps are "
        "diagonal per head over the positions; it has no value maps (its values are e_j − E|f).",
    ]
    report.add("\n".join(lines))


def _report_perplexity(report: Report, perplexity: dict, counts: dict, curves: dict, reused: dict) -> None:
    reference = perplexity["transformer"][1]
    rows = []
    for name, (loss, ppl) in perplexity.items():
        took = f"{curves[name]['seconds']:.0f} s" + (" (reused)" if reused[name] else "")
        rows.append(
            f"| {MODELS[name]} | {loss:.4f} | {ppl:.3f} | {ppl / reference:.3f}× | "
            f"{counts[name]['non_embedding']:,} | {took} |"
        )
    report.add(
        "\n".join(
            [
                "### Validation perplexity (exp of the mean next-token loss over the packed validation blocks)",
                "",
                "| model | loss | perplexity | vs transformer | parameters but the token embedding | training |",
                "|---|---|---|---|---|---|",
                *rows,
            ]
        )
    )


def _report_repetition(report: Report, repetition: dict, reference: dict, scale: StoriesScale) -> None:
    def row(label: str, m: dict) -> str:
        return (
            f"| {label} | {m['distinct_1']:.3f} | {m['distinct_2']:.3f} | {m['distinct_3']:.3f} | "
            f"{m['repetition_3']:.3f} | {m['words']:.1f} |"
        )

    rows = [row("validation text (the same prompts' stories)", reference)]
    rows += [row(f"{MODELS[name]}, {mode}", m) for name, by_mode in repetition.items() for mode, m in by_mode.items()]
    report.add(
        "\n".join(
            [
                f"### Repetition of generated stories (the first {scale.compare_words} words of each continuation)",
                "",
                "distinct-n: distinct n-grams / all n-grams, pooled over the stories (lower = more repetitive: "
                "loops inside a story, or stories that repeat each other); repetition: the mean share of a story's "
                "3-grams that repeat an earlier one of the same story (loops only).",
                "",
                "| text | distinct-1 | distinct-2 | distinct-3 | repetition (3-grams) | words (uncut) |",
                "|---|---|---|---|---|---|",
                *rows,
            ]
        )
    )


def _report_scores(report: Report, scores: dict, judge_name: str) -> None:
    def cell(value) -> str:
        return "n/a" if value is None else f"{value:.2f}"

    rows = [
        f"| {MODELS[name]} | {s['n_parsed']}/{s['n_stories']} | "
        + " | ".join(cell(s[c]) for c in CRITERIA)
        + f" | {score_text(mean_score(s))} |"
        for name, s in scores.items()
    ]
    report.add(
        "\n".join(
            [
                f"### Grades of the sampled stories by {judge_name} (not GPT-4o; 1-10, stories with all four scores)",
                "",
                "| model | parsed | " + " | ".join(CRITERIA) + " | mean |",
                "|---|---|" + "---|" * (len(CRITERIA) + 1),
                *rows,
            ]
        )
    )


def _report_samples(report: Report, prompts, generations: dict, shown: int) -> None:
    lines = ["### Sample stories (the prompt in bold, then each model's continuation)"]
    for index, (prompt, _) in enumerate(prompts[:shown]):
        lines += ["", f"Prompt {index + 1}: **{prompt}**", ""]
        for name, by_mode in generations.items():
            for mode, texts in by_mode.items():
                story = " ".join(texts[index].split())  # one line, so the markdown list stays intact
                lines.append(f"- {MODELS[name]}, {mode}: **{prompt}** {story}")
    report.add("\n".join(lines))


def _plot_curves(report: Report, curves: dict) -> None:
    from ...evaluation.plotting import new_panels, save_figure

    fig, (ax,) = new_panels(1, (6.5, 4.0))
    for index, (name, curve) in enumerate(curves.items()):
        color = f"C{index}"
        if curve["train"]:
            ax.plot(*zip(*curve["train"], strict=True), color=color, label=f"{MODELS[name]} (train)")
        if curve["validation"]:
            steps, losses = zip(*curve["validation"], strict=True)
            ax.plot(steps, losses, "o--", color=color, label=f"{MODELS[name]} (validation)")
    ax.set_xlabel("training step")
    ax.set_ylabel("next-token loss (nats)")
    ax.set_title("training curves (same blocks, same recipe)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    path = save_figure(fig, report.plot_path("training"))
    report.add_plot(path, "training and validation loss of the three models")
