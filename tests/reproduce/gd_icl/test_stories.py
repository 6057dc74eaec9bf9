"""The stories experiment of the functional-GD study: a tiny run end to end, reuse of finished runs, perplexity and
generation against loops written out here, and the claims' arithmetic on made-up numbers."""

from __future__ import annotations

import doctest
import json
import math
from pathlib import Path

import pytest
import torch

from hf_icl.evaluation.repetition import story_tokens
from hf_icl.evaluation.story_judge import CRITERIA
from hf_icl.reproduce.gd_icl import stories_claims, stories_training
from hf_icl.reproduce.gd_icl.stories import TITLE, stories
from hf_icl.reproduce.gd_icl.stories_claims import (
    judge_claims,
    parameter_claims,
    perplexity_claims,
    repetition_claim,
    repetition_metrics,
    story_prompts,
)
from hf_icl.reproduce.gd_icl.stories_training import MODELS, StoriesScale, prepare_data
from hf_icl.reproduce.report import VERDICTS, Report, judge
from hf_icl.training import lm_training
from hf_icl.training.checkpoints import list_checkpoints

TINY = StoriesScale(
    n_stories=40,
    validation_fraction=0.25,
    vocab_size=320,
    embed_dim=16,
    n_heads=2,
    context=32,
    batch_size=4,
    steps=6,
    warmup_steps=1,
    curve_points=3,
    eval_points=2,
    n_prompts=3,
    prompt_words=4,
    max_new_tokens=10,
    compare_words=8,
    judged_stories=2,
)
JUDGE_REPLY = "Grammar: 6\nConsistency: 5\nPlot: 4\nCreativity: 3"


def run_tiny(out: Path, **options) -> Report:
    report = Report("gd-icl", "stories", TITLE, "", "test", out)
    stories(report, out / "runs", scale=TINY, **options)
    report.write()
    return report


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("stories")
    prompts = []

    def judge(prompt: str) -> str:
        prompts.append(prompt)
        return JUDGE_REPLY

    report = run_tiny(out, judge=judge, judge_name="fixed-reply judge")
    return out, report, prompts


def test_a_tiny_run_writes_a_report_with_every_claim(tiny_run):
    out, report, _ = tiny_run
    text = (out / "results.md").read_text()
    assert len(report.claims) == 8 and all(claim.verdict in VERDICTS for claim in report.claims)
    phrases = ("0.13 %", "competes closely", "almost equals", "feed-forward layer helps", "repetition is", "GPT-4o")
    for phrase in phrases:
        assert any(phrase in claim.claim for claim in report.claims), phrase
    # the document's count under its reading holds, under GPT-2's split heads it does not (8192 / 787968 = 1.04 %)
    assert [c.verdict for c in report.claims[:2]] == ["holds", "does not hold"]
    assert "8,192 / 6,291,456 = 0.130 %" in report.claims[0].measured
    assert "8,192 / 787,968 = 1.040 %" in report.claims[1].measured
    assert report.size.startswith("corpus: template stories") and "context 32 tokens" in report.size
    plot = out / "gd-icl_stories_training.png"
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and plot.name in text
    numbers = json.loads((out / "results.json").read_text())["numbers"]["stories"]
    for name in MODELS:
        loss, ppl = numbers["validation_loss"][name], numbers["perplexity"][name]
        assert math.isfinite(loss) and ppl == pytest.approx(math.exp(loss), rel=1e-12)
        assert numbers["curves"][name]["train"] and numbers["curves"][name]["validation"]
        assert len(numbers["generations"][name]["greedy"]) == len(numbers["prompts"]) == 3
    assert numbers["attention_parameters"]["softmax_gd"]["attention"] == 2 * 2 * 16  # diagonal q and k, 2 heads
    assert numbers["attention_parameters"]["transformer"]["attention"] == 3 * 16 * 16 + 3 * 16
    assert numbers["vocab_size"] <= 320
    for prompt in numbers["prompts"]:
        assert f"**{prompt}**" in text  # sample stories in the report


def test_a_local_corpus_file_and_the_saved_tokenizer(tmp_path):
    from transformers import AutoTokenizer

    from hf_icl.data.stories import generate_template_stories

    path = tmp_path / "stories.jsonl"
    texts = [story.text for story in generate_template_stories(40, seed=9)]
    path.write_text("".join(json.dumps({"text": text}) + "\n" for text in texts))
    report = run_tiny(tmp_path / "out", corpus=path, steps=2)
    numbers = report.numbers["stories"]
    assert numbers["corpus"] == f"local stories from {str(path)!r}" and str(path) in report.size
    assert all(any(prompt in text for text in texts) for prompt in numbers["prompts"])  # prompts from the file
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "out" / "runs" / "stories" / "tokenizer")
    assert len(tokenizer) == numbers["vocab_size"] and tokenizer.decode(tokenizer(texts[0])["input_ids"]) == texts[0]


def test_the_judge_grades_each_models_sampled_stories(tiny_run):
    out, report, prompts = tiny_run
    assert len(prompts) == 3 * TINY.judged_stories  # three models, two sampled stories each
    scores = json.loads((out / "results.json").read_text())["numbers"]["stories"]["judge"]["scores"]
    for name in MODELS:
        assert scores[name]["n_parsed"] == 2
        assert [scores[name][c] for c in CRITERIA] == [6.0, 5.0, 4.0, 3.0]
    graded = [c for c in report.claims if "GPT-4o" in c.claim]
    assert [c.verdict for c in graded] == ["holds", "holds"]  # equal scores
    assert all("fixed-reply judge (not GPT-4o)" in c.measured for c in graded)
    assert "Grades of the sampled stories by fixed-reply judge" in (out / "results.md").read_text()


def test_perplexity_is_exp_of_the_mean_loss_over_the_validation_blocks(tiny_run):
    from transformers import AutoModelForCausalLM

    out, report, _ = tiny_run
    data = prepare_data(TINY, None, seed=0)
    model = AutoModelForCausalLM.from_pretrained(out / "runs" / "stories" / "softmax_gd").eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for block in data.validation_blocks:
            logits = model(input_ids=block[None]).logits[0]
            for t in range(len(block) - 1):  # token t + 1 predicted at t
                total -= float(torch.log_softmax(logits[t].double(), dim=-1)[block[t + 1]])
                count += 1
    expected = math.exp(total / count)
    measured = report.numbers["stories"]["perplexity"]["softmax_gd"]
    assert measured == pytest.approx(expected, rel=1e-5)
    assert count == data.validation_blocks.numel() - len(data.validation_blocks)


def test_finished_runs_are_reused_and_retrain_trains(tiny_run, tmp_path, monkeypatch):
    import shutil

    out, first, _ = tiny_run
    shutil.copytree(out / "runs", tmp_path / "runs")

    def no_training(*args, **kwargs):
        raise AssertionError("trained again")

    monkeypatch.setattr(stories_training, "train_model", no_training)
    again = run_tiny(tmp_path)  # the same settings: every model loaded, nothing trained
    assert again.numbers["stories"]["perplexity"] == first.numbers["stories"]["perplexity"]
    assert again.numbers["stories"]["curves"] == first.numbers["stories"]["curves"]
    assert again.numbers["stories"]["generations"] == first.numbers["stories"]["generations"]
    assert [c.verdict for c in again.claims[-2:]] == [VERDICTS[2]] * 2  # no judge this time
    with pytest.raises(AssertionError, match="trained again"):
        run_tiny(tmp_path, retrain=True)
    with pytest.raises(AssertionError, match="trained again"):
        run_tiny(tmp_path, steps=TINY.steps + 1)  # another setting: a new run


def test_runs_are_deterministic(tiny_run, tmp_path):
    out, first, _ = tiny_run
    again = run_tiny(tmp_path)  # trained afresh in another folder
    assert again.numbers["stories"]["perplexity"] == first.numbers["stories"]["perplexity"]
    assert again.numbers["stories"]["generations"] == first.numbers["stories"]["generations"]


def test_the_runs_train_through_the_package_loop(tiny_run):
    out, _, _ = tiny_run
    for name in MODELS:
        run_dir = out / "runs" / "stories" / name
        metrics = json.loads((run_dir / "metrics.json").read_text())
        assert metrics["task"] == "causal_lm" and metrics["scalars"]["steps"] == TINY.steps
        assert (run_dir / "manifest.json").is_file()
        assert [step for step, _ in list_checkpoints(run_dir)] == [TINY.steps]  # the newest checkpoint kept
        assert json.loads((run_dir / "run.json").read_text())["spec"]["trainer"] == stories_training.TRAINER


def test_a_run_cut_short_resumes_from_its_newest_checkpoint(tiny_run, tmp_path, monkeypatch):
    out, first, _ = tiny_run
    original, calls = lm_training._CausalLMRun._optimizer_step, []

    def cut_at_step_4(self):
        if self.step == 4:
            raise KeyboardInterrupt("cut short")
        calls.append(self.step)
        return original(self)

    monkeypatch.setattr(lm_training._CausalLMRun, "_optimizer_step", cut_at_step_4)
    with pytest.raises(KeyboardInterrupt):
        run_tiny(tmp_path)  # the first model stops after 4 of its 6 steps

    def counted(self):
        calls.append(self.step)
        return original(self)

    monkeypatch.setattr(lm_training._CausalLMRun, "_optimizer_step", counted)
    calls.clear()
    again = run_tiny(tmp_path)
    assert calls == [4, 5] + list(range(TINY.steps)) * 2  # the first model resumed at step 4, the others trained
    assert again.numbers["stories"]["perplexity"] == first.numbers["stories"]["perplexity"]
    for name in MODELS:  # bit-identical curves (seconds aside): the resumed run is the uninterrupted one
        resumed, whole = again.numbers["stories"]["curves"][name], first.numbers["stories"]["curves"][name]
        assert (resumed["train"], resumed["validation"]) == (whole["train"], whole["validation"])


def test_greedy_generation_equals_an_argmax_loop(tiny_run):
    from transformers import AutoModelForCausalLM

    out, report, _ = tiny_run
    data = prepare_data(TINY, None, seed=0)
    model = AutoModelForCausalLM.from_pretrained(out / "runs" / "stories" / "transformer").eval()
    prompt = report.numbers["stories"]["prompts"][0]
    tokenizer = data.tokenizer
    ids = [tokenizer.eos_token_id] + tokenizer(prompt)["input_ids"]  # a story starts after the end-of-text token
    new = []
    with torch.no_grad():
        for _ in range(TINY.max_new_tokens):
            token = int(model(input_ids=torch.tensor([ids + new])).logits[0, -1].argmax())
            new.append(token)
            if token == tokenizer.eos_token_id:
                break
    expected = tokenizer.decode(new, skip_special_tokens=True)
    assert report.numbers["stories"]["generations"]["transformer"]["greedy"][0] == expected


def test_story_prompts_cut_the_text_as_written():
    texts = ["Tom  had a\nred ball. He ran.", "Too short.", "Lily, the cat, sat down."]
    assert story_prompts(texts, 5, 3) == [("Tom  had a", "\nred ball. He ran."), ("Lily, the cat,", " sat down.")]
    assert story_prompts(texts, 1, 3) == [("Tom  had a", "\nred ball. He ran.")]


def test_repetition_metrics_by_counting():
    texts = ["the dog ran and the dog ran home", "a cat sat"]
    metrics = repetition_metrics(texts, words=7)
    cut = [["the", "dog", "ran", "and", "the", "dog", "ran"], ["a", "cat", "sat"]]
    for n in (1, 2, 3):
        grams = [tuple(words[i : i + n]) for words in cut for i in range(len(words) - n + 1)]
        assert metrics[f"distinct_{n}"] == len(set(grams)) / len(grams)
    # 3-grams of the first story: the dog ran | dog ran and | ran and the | and the dog | the dog ran (a repeat)
    assert metrics["repetition_3"] == pytest.approx((1 / 5 + 0 / 1) / 2)
    assert metrics["words"] == (len(story_tokens(texts[0])) + 3) / 2


def test_parameter_claims_arithmetic():
    rows = parameter_claims({"gd": 8192, "full_width_heads": 6_291_456, "gpt2_layer": 787_968})
    assert [judge(*row[3:])[0] for row in rows] == ["holds", "does not hold"]
    rows = parameter_claims({"gd": 8192, "full_width_heads": 8192 * 1000, "gpt2_layer": 8192 * 770})
    assert [judge(*row[3:])[0] for row in rows] == ["does not hold", "holds"]  # 0.10 % and 0.1299 % (rounds to 0.13)
    assert stories_claims.full_width_attention(512, 8) == 6_291_456


@pytest.mark.parametrize(
    "gd, gd_ff, verdicts",
    [
        (12.5, 11.0, ["holds", "holds", "holds"]),  # exactly 1.25× and 1.1×
        (12.6, 11.01, ["does not hold", "does not hold", "holds"]),
        (10.5, 10.7, ["holds", "holds", "does not hold"]),  # FF does not help
    ],
)
def test_perplexity_claims_arithmetic(gd, gd_ff, verdicts):
    rows = perplexity_claims({"softmax_gd": gd, "softmax_gd_ff": gd_ff, "transformer": 10.0}, vocab_size=1000)
    assert [judge(*row[3:])[0] for row in rows] == verdicts


def test_perplexity_claims_need_a_transformer_that_learned():
    # the rule: validation NLL below 0.9 × log(vocab_size), i.e. perplexity below 1000^0.9 ≈ 501.2
    rows = perplexity_claims({"softmax_gd": 600.0, "softmax_gd_ff": 600.0, "transformer": 502.0}, vocab_size=1000)
    assert [judge(*row[3:])[0] for row in rows] == [VERDICTS[2]] * 3
    rows = perplexity_claims({"softmax_gd": 600.0, "softmax_gd_ff": 600.0, "transformer": 501.0}, vocab_size=1000)
    assert [judge(*row[3:])[0] for row in rows] == ["holds", "does not hold", "does not hold"]


def test_repetition_claim_arithmetic():
    reference = {"distinct_2": 0.5, "repetition_3": 0.01}
    below = {name: {"distinct_2": 0.39, "repetition_3": 0.2} for name in MODELS}
    row = repetition_claim(below, reference)
    assert judge(*row[3:])[0] == "holds" and "Softmax GD 0.390 (0.78×)" in row[2] and "validation text 0.010" in row[2]
    one_above = {**below, "transformer": {"distinct_2": 0.4, "repetition_3": 0.0}}  # 0.8× exactly is not below
    assert judge(*repetition_claim(one_above, reference)[3:])[0] == "does not hold"
    empty = {**below, "softmax_gd": {"distinct_2": math.nan, "repetition_3": math.nan}}
    assert judge(*repetition_claim(empty, reference)[3:])[0] == VERDICTS[2]


def test_judge_claims_arithmetic():
    assert [judge(*row[3:])[0] for row in judge_claims(None, "x")] == [VERDICTS[2]] * 2

    def summary(mean: float, parsed: int = 4) -> dict:
        return {"n_stories": 4, "n_parsed": parsed, **{c: mean for c in CRITERIA}}

    scores = {"softmax_gd": summary(6.0), "softmax_gd_ff": summary(6.4), "transformer": summary(7.0)}
    assert [judge(*row[3:])[0] for row in judge_claims(scores, "x")] == [
        "holds",
        "does not hold",
    ]  # within 1.0; not within 0.5
    scores["softmax_gd"] = summary(5.9)
    assert judge(*judge_claims(scores, "x")[0][3:])[0] == "does not hold"
    scores["softmax_gd_ff"] = summary(6.6, parsed=1)  # fewer than half parsed
    assert judge(*judge_claims(scores, "x")[1][3:])[0] == VERDICTS[2]


def test_bad_arguments(tmp_path):
    report = Report("gd-icl", "stories", TITLE, "", "", tmp_path)
    with pytest.raises(ValueError, match="steps"):
        stories(report, tmp_path, steps=0, scale=TINY)
    with pytest.raises(ValueError, match="judge must be a callable"):
        stories(report, tmp_path, judge="gpt-4o", scale=TINY)
    with pytest.raises(ValueError, match="seed"):
        stories(report, tmp_path, seed=-1, scale=TINY)
    with pytest.raises(ValueError, match="embed_dim must be a multiple of n_heads"):
        StoriesScale(embed_dim=10, n_heads=4)
    with pytest.raises(ValueError, match="batch_size"):
        StoriesScale(batch_size=0)
    with pytest.raises(ValueError, match="temperature"):
        StoriesScale(temperature=0.0)
    assert not any(tmp_path.rglob("*.safetensors"))


def test_validation_perplexity_of_a_uniform_model_is_the_vocabulary_size():
    class Uniform(torch.nn.Module):  # equal logits everywhere: every token has probability 1 / V
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.zeros(1))

        def forward(self, input_ids, use_cache=False):
            return type("Out", (), {"logits": self.weight + torch.zeros(*input_ids.shape, 37)})()

    loss, ppl = stories_claims.validation_perplexity(Uniform(), torch.randint(37, (5, 9)), batch_size=2)
    assert loss == pytest.approx(math.log(37)) and ppl == pytest.approx(37.0)


def test_docstring_examples_run():
    modules = (stories_claims, stories_training)
    assert sum(doctest.testmod(m, raise_on_error=True).attempted for m in modules) >= 10
