"""The gd-icl reproduction (seed 004) at a tiny scale: both experiments run end to end, finished runs are reused, the
GD models are the construction with only W_e, η and h learned (their accuracy is functional GD's), and the episode
sampler, the digit features and linear probing match independent references."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModel

from hf_icl.modeling.gd_transformer import (
    GDTransformerForInContextClassification,
    distance_to_construction,
    functional_gd_logits,
)
from hf_icl.modeling.model_folder import read_model_manifest
from hf_icl.reproduce import PAPERS, gd_icl, run_experiment
from hf_icl.reproduce.report import VERDICTS, Report
from hf_icl.training import TrainingDivergedError

SYNTHETIC = gd_icl.SyntheticScale(
    n_classes=5,
    n_context=6,
    n_dims=2,
    embed_dim=8,
    task_counts=(20, 30000),
    gd_models=(("rbf", 1), ("softmax", 1), ("softmax", 2), ("softmax", 6)),
    trained_models=(("rbf", 1), ("softmax", 2)),
    batch_size=8,
    gd_steps=4,
    trained_steps=6,
    eval_prompts=40,
    stationarity_prompts=40,
)
FEATURES = gd_icl.FeatureScale(
    n_components=6, n_shots=3, n_queries=2, blocks=(1, 2, 3), embed_dim=4, batch_size=8, steps=4, eval_episodes=6
)
TINY = gd_icl.Scale(seeds=(3, 4), synthetic=SYNTHETIC, features=FEATURES)


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    out = tmp_path_factory.mktemp("gd_icl")
    paths = {
        e: run_experiment("gd-icl", e, output_dir=out, scale=TINY, command="test", workers=1)
        for e in ("synthetic", "features")
    }
    return out, paths


def summary(path):
    return json.loads((path.parent / "results.json").read_text())


def test_registered():
    assert PAPERS["gd-icl"] is gd_icl.PAPER_SPEC
    assert {"synthetic", "features"} <= set(gd_icl.EXPERIMENTS)


def test_synthetic_writes_tables_plots_claims_and_numbers(finished):
    _, paths = finished
    path = paths["synthetic"]
    text = path.read_text()
    assert "top-1 accuracy at the query" in text and "distance of the trained parameters" in text
    for name in ("accuracy", "nll"):
        assert (path.parent / f"gd-icl_synthetic_{name}.png").stat().st_size > 0
    result = summary(path)
    claims = result["claims"]
    assert len(claims) == 7 and all(c["verdict"] in VERDICTS for c in claims)
    assert "stationary point" in claims[-1]["claim"] and "a stationary point of the loss?" in text
    stationarity = result["numbers"]["synthetic"]["stationarity"]
    assert sorted(stationarity) == ["gd_rbf_1", "gd_softmax_1", "gd_softmax_2", "gd_softmax_6"]
    assert all(r["noise_floor"] > 0 for v in stationarity.values() for r in v["gd"] + v["control"])
    numbers = result["numbers"]["synthetic"]
    names = [s.name for s in gd_icl.synthetic_specs(TINY)]
    assert sorted(numbers["metrics"]) == sorted(names)
    for values in numbers["metrics"].values():  # (L, seeds) accuracies in [0, 1], NLLs positive
        assert torch.tensor(values["accuracy"]).shape == (2, 2)
        assert all(0 <= a <= 1 for row in values["accuracy"] for a in row)
        assert all(n > 0 for row in values["nll"] for n in row)
    assert sorted(numbers["distances"]) == ["trained_rbf_1", "trained_softmax_2"]
    assert len(numbers["distances"]["trained_softmax_2"]) == 2  # one list of per-seed results per L


def test_synthetic_accuracy_of_a_gd_model_is_functional_gds(finished):
    """Recompute the reported accuracy of the 2-block softmax GD model at L = 20, seed 3, from its saved W_e, η, h
    with functional_gd_logits on the seed's evaluation prompts."""
    out, paths = finished
    run_dir = out / "gd-icl" / "runs" / "L20" / "gd_softmax_2" / "seed3"
    model = GDTransformerForInContextClassification.from_pretrained(run_dir)
    values = gd_icl.learned_values(model)
    xs, ys, _ = gd_icl.synthetic_eval_set(SYNTHETIC, 3)
    logits = functional_gd_logits(
        xs.double(), ys, model.class_embedding.weight.detach().double(), 2, values["step_size"], "softmax",
        bandwidth=values["bandwidth"], normalize_by_count=True,
    )[:, -1]  # fmt: skip
    accuracy = float((logits.argmax(-1) == ys[:, -1]).double().mean())
    nll = float(F.cross_entropy(logits, ys[:, -1]))
    reported = summary(paths["synthetic"])["numbers"]["synthetic"]["metrics"]["gd_softmax_2"]
    assert reported["accuracy"][0][0] == pytest.approx(accuracy, abs=1e-12)
    assert reported["nll"][0][0] == pytest.approx(nll, rel=1e-4)


def test_features_writes_table_plot_claims_and_numbers(finished):
    _, paths = finished
    path = paths["features"]
    assert "linear probing" in path.read_text()
    assert (path.parent / "gd-icl_features_accuracy.png").stat().st_size > 0
    result = summary(path)
    assert [c["verdict"] in VERDICTS for c in result["claims"]] == [True, True]
    accuracy = result["numbers"]["features"]["accuracy"]
    assert sorted(accuracy) == ["gd_softmax_1", "gd_softmax_2", "gd_softmax_3", "linear_probe"]
    assert all(len(accuracy[n]) == 2 for n in ("gd_softmax_1", "gd_softmax_2", "gd_softmax_3"))  # one per seed
    assert len(accuracy["linear_probe"]) == 1  # deterministic: the same episodes for every seed
    assert all(0 <= a <= 1 for v in accuracy.values() for a in v)


def test_features_linear_probe_number_is_sklearns_on_the_evaluation_episodes(finished):
    from sklearn.linear_model import LogisticRegression

    _, paths = finished
    (reported,) = summary(paths["features"])["numbers"]["features"]["accuracy"]["linear_probe"]
    episodes = gd_icl.feature_eval_episodes(FEATURES, TINY.seeds[0])
    correct = 0
    for e in range(FEATURES.eval_episodes):
        probe = LogisticRegression(max_iter=1000).fit(episodes.context_x[e].double(), episodes.context_y[e])
        correct += int((torch.from_numpy(probe.predict(episodes.query_x[e].double())) == episodes.query_y[e]).sum())
    assert reported == pytest.approx(correct / (FEATURES.eval_episodes * FEATURES.n_queries))
    assert set(episodes.classes.flatten().tolist()) <= set(FEATURES.test_classes)


def test_finished_runs_are_reused_not_retrained(finished, monkeypatch):
    out, _ = finished

    def no_training(*args, **kwargs):
        raise AssertionError("a finished run was retrained")

    monkeypatch.setattr(gd_icl.SeedEnsemble, "step", no_training)
    monkeypatch.setattr(gd_icl.GDConstructionEnsemble, "step", no_training)
    for experiment in ("synthetic", "features"):
        path = run_experiment("gd-icl", experiment, output_dir=out, scale=TINY, command="test", workers=1)
        assert path.is_file()


def test_a_changed_spec_retrains_and_two_processes_train_what_one_would(finished, tmp_path):
    out, _ = finished
    jobs = [
        (gd_icl.Stream("synthetic", 20), gd_icl.ModelSpec("gd", "rbf", 1, 3, 1e-2)),
        (gd_icl.Stream("synthetic", 20), gd_icl.ModelSpec("trained", "rbf", 1, 3, 1e-3)),
    ]
    runs = out / "gd-icl" / "runs"
    before = (runs / "L20" / "gd_rbf_1" / "run.json").read_text()
    parallel = gd_icl.train_models(TINY, jobs, runs, workers=2)
    assert (runs / "L20" / "gd_rbf_1" / "run.json").read_text() != before  # 3 steps, not 4: retrained
    single = gd_icl.train_models(TINY, jobs, tmp_path, workers=1)
    xs, ys, _ = gd_icl.synthetic_eval_set(SYNTHETIC, 0)
    for job in jobs:
        for a, b in zip(parallel[job], single[job], strict=True):
            assert torch.equal(a(xs, ys).logits, b(xs, ys).logits)


# -- checkpoints: a stream that stopped resumes bit for bit --------------------------------------------------------
RESUMED_JOBS = [
    (gd_icl.Stream("synthetic", 20), gd_icl.ModelSpec("gd", "rbf", 1, 12, 1e-2)),  # a checkpoint every step
    (gd_icl.Stream("synthetic", 20), gd_icl.ModelSpec("trained", "rbf", 1, 20, 1e-3)),  # every second step
]


def _stopping_step(monkeypatch, stop_at: int, seen: list | None = None):
    """Patch the trained model's step to raise in its ``stop_at``-th call (the GD model has taken that step)."""
    original, calls = gd_icl.SeedEnsemble.step, [0]

    def step(self, xs, ys):
        calls[0] += 1
        if seen is not None:
            seen.append(calls[0])
        if calls[0] == stop_at:
            raise KeyboardInterrupt("stopped")
        return original(self, xs, ys)

    monkeypatch.setattr(gd_icl.SeedEnsemble, "step", step)


def _assert_same_runs(whole, other):
    from safetensors.torch import load_file

    from hf_icl.evaluation.runs import read_metrics
    from hf_icl.training.run_cache import read_run

    for stream, spec in RESUMED_JOBS:
        run_spec = gd_icl.training_spec(TINY, stream, spec)
        a, b = (read_run(runs / stream.name / spec.name, run_spec) for runs in (whole, other))
        assert a.tensors["losses"].shape == (spec.steps, len(TINY.seeds))
        assert torch.equal(a.tensors["losses"], b.tensors["losses"])
        for seed in TINY.seeds:
            wa, wb = (
                load_file(runs / stream.name / spec.name / f"seed{seed}" / "model.safetensors")
                for runs in (whole, other)
            )
            assert sorted(wa) == sorted(wb) and all(torch.equal(wa[key], wb[key]) for key in wa)
        assert not (other / stream.name / spec.name / "checkpoints").exists()
        metrics = read_metrics(other / stream.name / spec.name / "metrics.json")
        assert metrics == read_metrics(whole / stream.name / spec.name / "metrics.json")
        assert metrics["curves"]["train"] == a.tensors["losses"].T.tolist()
        assert metrics["seeds"] == list(TINY.seeds) and metrics["stream"] == "L20" and metrics["spec"] == spec.name
    metrics = read_metrics(other / "L20" / "gd_rbf_1" / "metrics.json")
    assert {"final_train_loss", "step_size", "bandwidth", "embedding_norm"} <= set(metrics["per_seed"]["3"])


def test_a_stopped_stream_resumes_to_the_uninterrupted_losses_and_weights(tmp_path, monkeypatch, capsys):
    """The GD model (12 steps) and the trained model (20) of one stream checkpoint together at every tenth of either
    unfinished model's steps (every step up to 11, then every second). Stopped in step 7, the stream resumes both at
    step 6 (the batch generators restored); stopped again in step 15, after the GD model was finished and saved, the
    trained model resumes alone at step 14; both end with the losses, weights and metrics.json of a stream never
    stopped, their checkpoints removed."""
    from hf_icl.training.checkpoints import list_checkpoints

    whole, stopped = tmp_path / "whole", tmp_path / "stopped"
    gd_icl.train_models(TINY, RESUMED_JOBS, whole, workers=1)
    gd_dir, trained_dir = stopped / "L20" / "gd_rbf_1", stopped / "L20" / "trained_rbf_1"
    with monkeypatch.context() as patch:
        _stopping_step(patch, 7)
        with pytest.raises(KeyboardInterrupt):
            gd_icl.train_models(TINY, RESUMED_JOBS, stopped, workers=1)
    assert [step for step, _ in list_checkpoints(gd_dir)] == [5, 6]
    assert [step for step, _ in list_checkpoints(trained_dir)] == [5, 6]  # with the GD model's, at its steps
    assert not (gd_dir / "metrics.json").exists()
    capsys.readouterr()
    with monkeypatch.context() as patch:
        _stopping_step(patch, 15 - 6)  # the trained model's step 15: 9 steps after step 6
        with pytest.raises(KeyboardInterrupt):
            gd_icl.train_models(TINY, RESUMED_JOBS, stopped, workers=1)
    out = capsys.readouterr().out
    assert "L20/gd_rbf_1: resumed from" in out and "L20/trained_rbf_1: resumed from" in out and "at step 6" in out
    assert (gd_dir / "metrics.json").is_file() and not (gd_dir / "checkpoints").exists()  # finished at step 12
    assert [step for step, _ in list_checkpoints(trained_dir)] == [12, 14]
    gd_icl.train_models(TINY, RESUMED_JOBS, stopped, workers=1)
    out = capsys.readouterr().out
    assert "reusing" in out and "L20/trained_rbf_1: resumed from" in out and "at step 14" in out
    _assert_same_runs(whole, stopped)


def test_retrain_starts_a_stopped_stream_from_the_start(tmp_path, monkeypatch, capsys):
    """With ``retrain`` the checkpoints of a stopped stream are removed, not resumed: step 1 is trained again."""
    runs = tmp_path / "runs"
    with monkeypatch.context() as patch:
        _stopping_step(patch, 5)
        with pytest.raises(KeyboardInterrupt):
            gd_icl.train_models(TINY, RESUMED_JOBS, runs, workers=1)
    assert (runs / "L20" / "trained_rbf_1" / "checkpoints").is_dir()
    capsys.readouterr()
    seen: list[int] = []
    with monkeypatch.context() as patch:
        _stopping_step(patch, 0, seen)
        gd_icl.train_models(TINY, RESUMED_JOBS, runs, retrain=True, workers=1)
    assert len(seen) == 20 and "resumed from" not in capsys.readouterr().out
    gd_icl.train_models(TINY, RESUMED_JOBS, tmp_path / "whole", workers=1)
    _assert_same_runs(tmp_path / "whole", runs)


def test_common_resume_step_is_the_newest_shared_step_and_removes_the_others(tmp_path):
    from hf_icl.training.checkpoints import list_checkpoints
    from hf_icl.training.seed_checkpoints import common_resume_step

    ensembles = [gd_icl.GDConstructionEnsemble(1, "rbf", FIELDS, (3, 4), 1e-2, n_context=6) for _ in range(2)]
    xs, ys = torch.rand(2, 8, 7, 3), torch.randint(4, (2, 8, 7))
    dirs, specs = [tmp_path / "a", tmp_path / "b"], [{"model": "a"}, {"model": "b"}]
    for step in range(1, 5):
        for i, ensemble in enumerate(ensembles):
            ensemble.step(xs, ys)
            if i == 0 or step % 2 == 0:
                ensemble.save_checkpoint(dirs[i], spec=specs[i])
    assert common_resume_step(dirs, specs) == 4
    ensembles[0].step(xs, ys)
    ensembles[0].save_checkpoint(dirs[0], spec=specs[0])  # step 5: only a has it
    assert common_resume_step(dirs, specs) == 4
    assert [[s for s, _ in list_checkpoints(d)] for d in dirs] == [[4], [4]]  # the rest removed
    assert common_resume_step(dirs, [{"model": "a"}, {"model": "other"}]) is None
    assert not any((d / "checkpoints").exists() for d in dirs)
    ensembles[0].save_checkpoint(dirs[0], spec=specs[0])
    ensembles[1].save_checkpoint(dirs[1], spec=specs[1])
    assert common_resume_step(dirs, specs, resume=False) is None and not (dirs[0] / "checkpoints").exists()
    assert common_resume_step([], []) is None


# -- the GD models ---------------------------------------------------------------------------------------------------
FIELDS = {"n_dims": 3, "n_points": 7, "embed_dim": 5, "n_classes": 4, "normalize_by_count": True}


@pytest.mark.parametrize("kernel, n_blocks", [("rbf", 1), ("softmax", 2), ("rbf", 3)])
def test_gd_ensemble_learns_only_embeddings_step_size_and_bandwidth(kernel, n_blocks):
    """After training, each seed's model is the construction (distance 0) with its own η and h, its training path
    gives the built model's logits, and those equal functional GD with the learned numbers."""
    ensemble = gd_icl.GDConstructionEnsemble(n_blocks, kernel, FIELDS, seeds=(0, 1), learning_rate=0.05)
    g = torch.Generator().manual_seed(0)
    for _ in range(5):
        ensemble.step(torch.rand(2, 16, 7, 3, generator=g), torch.randint(4, (2, 16, 7), generator=g))
    xs, ys = torch.rand(9, 7, 3, generator=g), torch.randint(4, (9, 7), generator=g)
    training_path = ensemble.logits(xs, ys)
    for i, (model, values) in enumerate(zip(ensemble.models(), ensemble.learned(), strict=True)):
        assert values["step_size"] != 1.0 and values["bandwidth"] != 1.0  # both moved
        result = distance_to_construction(model)
        assert max(v for k, v in result.items() if not k.endswith(".scale")) < 1e-5
        assert result["blocks.0.update.ov.scale"] == pytest.approx(values["step_size"], rel=1e-5)
        assert gd_icl.learned_values(model)["step_size"] == pytest.approx(values["step_size"], rel=1e-6)
        with torch.no_grad():
            logits = model(xs, ys).logits
        torch.testing.assert_close(training_path[i], logits, rtol=1e-4, atol=1e-5)
        reference = functional_gd_logits(
            xs.double(), ys, model.class_embedding.weight.detach().double(), n_blocks, values["step_size"], kernel,
            bandwidth=values["bandwidth"], normalize_by_count=True,
        )  # fmt: skip
        torch.testing.assert_close(logits.double(), reference, rtol=1e-4, atol=1e-5)
        assert torch.equal(model.class_embedding.weight.detach(), ensemble.params["W_e"][i])


def test_gd_ensemble_seeds_are_independent_and_start_at_their_own_embeddings():
    together = gd_icl.GDConstructionEnsemble(1, "softmax", FIELDS, seeds=(5, 6), learning_rate=0.05)
    alone = gd_icl.GDConstructionEnsemble(1, "softmax", FIELDS, seeds=(6,), learning_rate=0.05)
    assert torch.equal(together.params["W_e"][1], gd_icl.initial_embeddings(5, 4, 6))
    g = torch.Generator().manual_seed(1)
    for _ in range(3):
        xs, ys = torch.rand(2, 8, 7, 3, generator=g), torch.randint(4, (2, 8, 7), generator=g)
        together.step(xs, ys)
        alone.step(xs[1:], ys[1:])
    for name in together.params:
        torch.testing.assert_close(together.params[name][1], alone.params[name][0], rtol=1e-5, atol=1e-6)


def test_gd_ensemble_checks_every_seed_finite_and_saves_manifested_folders(tmp_path):
    """The seed-stacked trainer's guarantees (hf_icl.training.seed_ensemble): a NaN in one seed's batch stops
    training naming that seed, and save writes seed<seed> folders with model manifests that loading verifies."""
    ensemble = gd_icl.GDConstructionEnsemble(1, "softmax", FIELDS, seeds=(5, 6), learning_rate=0.05)
    g = torch.Generator().manual_seed(1)
    ensemble.step(torch.rand(2, 8, 7, 3, generator=g), torch.randint(4, (2, 8, 7), generator=g))
    folders = ensemble.save(tmp_path)
    assert folders == [tmp_path / "seed5", tmp_path / "seed6"]
    xs, ys = torch.rand(3, 7, 3, generator=g), torch.randint(4, (3, 7), generator=g)
    for folder, model in zip(folders, ensemble.models(), strict=True):
        assert {"config.json", "model.safetensors"} <= set(read_model_manifest(folder)["files"])
        loaded = AutoModel.from_pretrained(folder).eval()
        with torch.no_grad():
            assert torch.equal(loaded(xs, ys).logits, model(xs, ys).logits)
    xs = torch.rand(2, 8, 7, 3, generator=g)
    xs[0, 1, 2, 0] = float("nan")  # seed 5's batch
    with pytest.raises(TrainingDivergedError, match=r"at step 2 \(seed 5\): seed 5: the loss is nan"):
        ensemble.step(xs, torch.randint(4, (2, 8, 7), generator=g))


def test_gd_ensemble_bad_arguments():
    with pytest.raises(ValueError, match="missing \\['embed_dim'\\]"):
        gd_icl.GDConstructionEnsemble(1, "rbf", {"n_dims": 3, "n_classes": 4}, (0,), 0.1)
    with pytest.raises(ValueError, match="seeds must name at least one seed"):
        gd_icl.GDConstructionEnsemble(1, "rbf", FIELDS, (), 0.1)
    with pytest.raises(ValueError, match="initial_bandwidth must be a number in"):
        gd_icl.GDConstructionEnsemble(1, "rbf", FIELDS, (0,), 0.1, initial_bandwidth=0.0)
    ensemble = gd_icl.GDConstructionEnsemble(1, "rbf", FIELDS, (0, 1), 0.1)
    with pytest.raises(ValueError, match="one batch per seed"):
        ensemble.step(torch.rand(3, 4, 7, 3), torch.randint(4, (3, 4, 7)))


def test_relevant_groups_are_the_heads_that_change_the_logits():
    """In the construction, removing a head named relevant (its value map zeroed) or perturbing its score (query
    map) changes the logits; doing either to any other head leaves them exactly as they were."""
    n_blocks = 3
    relevant = set(gd_icl.relevant_groups(n_blocks))
    assert len(relevant) == 2 * (3 + 1 + 2)  # head 1 × 3, erase in block 1, cross-attention in blocks 0-1
    xs, ys = torch.rand(4, 7, 3, dtype=torch.float64), torch.randint(4, (4, 7))
    embeddings = torch.randn(5, 4, dtype=torch.float64)

    def build():
        return GDTransformerForInContextClassification.from_gd_construction(
            n_blocks, 0.7, "softmax", embeddings, n_dims=3, normalize_by_count=True
        )

    base = build()(xs, ys).logits
    for b in range(n_blocks):
        for head in ("update", "erase", "expect"):
            prefix = f"blocks.{b}." + ("cross_attention." if head == "expect" else f"self_attention.{head}_")
            assert (f"blocks.{b}.{head}.qk" in relevant) == (f"blocks.{b}.{head}.ov" in relevant)
            for projection, change in (("value", torch.zeros_like), ("query", lambda w: w + torch.randn_like(w))):
                model = build()
                with torch.no_grad():
                    weight = model.get_parameter(prefix + projection + ".weight")
                    weight.copy_(change(weight))
                    changed = not torch.equal(model(xs, ys).logits, base)
                assert changed == (f"blocks.{b}.{head}.qk" in relevant), (b, head, projection)


# -- claims ----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "trained, expected",
    [
        ([0.10, 0.20, 0.30], "holds"),  # matches GD (0.3) only at L = 50000 > 25000
        ([0.30, 0.30, 0.30], "does not hold"),  # already at L = 1000
        ([0.10, 0.10, 0.10], "not testable at this size"),  # never
        ([0.10, 0.20, 0.30, "nothing"], "not testable at this size"),  # matches, but its NLL stayed at chance's
    ],
)
def test_needs_more_tasks_verdicts(tmp_path, trained, expected):
    scale = gd_icl.Scale(synthetic=replace_counts((1000, 10000, 50000)))
    report = Report("gd-icl", "synthetic", "t", "tiny", "test", tmp_path)
    ctx = gd_icl.ExperimentState(scale, tmp_path, tmp_path, report)
    gd = gd_icl.ModelSpec("gd", "softmax", 2, 1, 0.1)
    tf = gd_icl.ModelSpec("trained", "softmax", 2, 1, 0.1)
    learned = [[2.0, 2.0]] * 3  # NLL well below chance's log 25 = 3.22
    nothing = trained[-1] == "nothing"
    trained = trained[:3]
    metrics = {
        gd.name: {"accuracy": [[0.3, 0.3]] * 3, "nll": learned},
        tf.name: {"accuracy": [[a, a] for a in trained], "nll": [[3.2, 3.2]] * 3 if nothing else learned},
    }
    by = {("gd", "softmax", 2): gd, ("trained", "softmax", 2): tf}
    gd_icl.needs_more_tasks_claim(ctx, by, metrics, 2, 25000, ("softmax",))
    assert report.claims[0].verdict == expected


def replace_counts(counts):
    from dataclasses import replace

    return replace(gd_icl.SyntheticScale(), task_counts=counts)


def test_query_metrics_match_the_formulas():
    logits = torch.tensor([[1.0, 2.0, 0.0], [3.0, 0.0, 0.5], [0.0, 0.0, 4.0]])
    labels = torch.tensor([1, 2, 2])
    accuracy, nll = gd_icl.query_metrics(logits, labels)
    assert accuracy == pytest.approx(2 / 3)
    rows = zip(logits.tolist(), labels.tolist(), strict=True)
    by_hand = [-(row[y] - math.log(sum(math.exp(v) for v in row))) for row, y in rows]
    assert nll == pytest.approx(sum(by_hand) / 3)


# -- episodes, features, linear probing -------------------------------------------------------------------------------
def labelled_rows(sizes=(9, 8, 10, 12, 9)):
    """Features whose first coordinate is the row's index (so rows can be traced) and whose label is its class."""
    labels = torch.cat([torch.full((n,), c) for c, n in enumerate(sizes)])
    features = torch.stack([torch.arange(len(labels), dtype=torch.float32), torch.randn(len(labels))], dim=1)
    return features, labels


def test_sample_episodes_shapes_labels_and_disjoint_rows():
    features, labels = labelled_rows()
    episodes = gd_icl.sample_episodes(features, labels, 50, n_ways=3, n_shots=4, n_queries=3, classes=[1, 2, 3], seed=0)
    assert episodes.context_x.shape == (50, 12, 2) and episodes.context_y.shape == (50, 12)
    assert episodes.query_x.shape == (50, 3, 2) and episodes.query_y.shape == (50, 3)
    assert episodes.classes.shape == (50, 3)
    permutations = set()
    for e in range(50):
        classes = episodes.classes[e]
        assert sorted(classes.tolist()) == sorted(set(classes.tolist())) and set(classes.tolist()) <= {1, 2, 3}
        permutations.add(tuple(classes.tolist()))
        context_rows = episodes.context_x[e, :, 0].long()
        query_rows = episodes.query_x[e, :, 0].long()
        assert len(set(context_rows.tolist())) == 12  # distinct examples
        assert not set(query_rows.tolist()) & set(context_rows.tolist())  # a query is never a context example
        assert len(set(query_rows.tolist())) == 3
        # label k of the episode is class classes[k], for context and queries
        assert torch.equal(labels[context_rows], classes[episodes.context_y[e]])
        assert torch.equal(labels[query_rows], classes[episodes.query_y[e]])
        assert torch.equal(torch.bincount(episodes.context_y[e], minlength=3), torch.full((3,), 4))
        assert not torch.equal(episodes.context_y[e], episodes.context_y[e].sort().values)  # shuffled
    assert len(permutations) == 6  # all 3! class -> label permutations appear in 50 episodes


def test_sample_episodes_is_seeded_and_prompts_append_each_query():
    features, labels = labelled_rows()
    kwargs = dict(n_ways=2, n_shots=3, n_queries=2, classes=(0, 4))
    a = gd_icl.sample_episodes(features, labels, 5, seed=7, **kwargs)
    b = gd_icl.sample_episodes(features, labels, 5, generator=torch.Generator().manual_seed(7), **kwargs)
    c = gd_icl.sample_episodes(features, labels, 5, seed=8, **kwargs)
    assert all(torch.equal(getattr(a, f), getattr(b, f)) for f in ("context_x", "context_y", "query_x", "query_y"))
    assert not torch.equal(a.context_x, c.context_x)
    xs, ys = a.prompts()
    assert xs.shape == (10, 7, 2) and ys.shape == (10, 7)
    for e in range(5):
        for q in range(2):
            assert torch.equal(xs[2 * e + q, :6], a.context_x[e]) and torch.equal(ys[2 * e + q, :6], a.context_y[e])
            assert torch.equal(xs[2 * e + q, 6], a.query_x[e, q]) and ys[2 * e + q, 6] == a.query_y[e, q]


def test_sample_episodes_accepts_numpy_and_rejects_bad_input():
    features, labels = labelled_rows()
    episodes = gd_icl.sample_episodes(features.numpy(), labels.numpy(), 2, n_ways=2, n_shots=2, seed=0)
    assert episodes.context_x.shape == (2, 4, 2)
    with pytest.raises(ValueError, match="every class needs n_shots \\+ n_queries = 11 examples"):
        gd_icl.sample_episodes(features, labels, 2, n_ways=2, n_shots=8, n_queries=3)
    with pytest.raises(ValueError, match="absent: \\[7\\]"):
        gd_icl.sample_episodes(features, labels, 2, n_ways=2, n_shots=2, classes=[0, 7])
    with pytest.raises(ValueError, match="n_ways must be an integer in \\[2, 2\\], got 3"):
        gd_icl.sample_episodes(features, labels, 2, n_ways=3, n_shots=2, classes=[0, 1])
    with pytest.raises(ValueError, match="labels must be"):
        gd_icl.sample_episodes(features, labels[:-1], 2, n_ways=2, n_shots=2)
    with pytest.raises(ValueError, match="features must be"):
        gd_icl.sample_episodes(labels, labels, 2, n_ways=2, n_shots=2)
    with pytest.raises(ValueError, match="either generator= or seed="):
        gd_icl.sample_episodes(features, labels, 2, n_ways=2, n_shots=2, seed=0, generator=torch.Generator())


def test_linear_probe_is_sklearn_fitted_on_the_episode_context():
    from sklearn.linear_model import LogisticRegression

    features, labels = labelled_rows()
    features[:, 0] = labels + 0.3 * torch.randn(len(labels))  # make the classes learnable
    episodes = gd_icl.sample_episodes(features, labels, 3, n_ways=3, n_shots=4, n_queries=3, seed=1)
    probabilities = gd_icl.linear_probe(episodes, C=0.5)
    assert probabilities.shape == (3, 3, 3)
    for e in range(3):
        by_hand = LogisticRegression(C=0.5, max_iter=1000).fit(episodes.context_x[e].double(), episodes.context_y[e])
        expected = torch.from_numpy(by_hand.predict_proba(episodes.query_x[e].double()))
        torch.testing.assert_close(probabilities[e], expected)


def test_digit_features_are_pca_of_the_training_classes_only():
    from sklearn.datasets import load_digits
    from sklearn.decomposition import PCA

    features, labels = gd_icl.digit_features((0, 1, 2), 5)
    digits = load_digits()
    train = torch.isin(labels, torch.tensor([0, 1, 2]))
    assert torch.equal(labels, torch.from_numpy(digits.target))
    assert float(features[train].norm(dim=1).mean()) == pytest.approx(1.0, rel=1e-5)
    pca = PCA(n_components=5).fit(digits.data[train.numpy()])
    projected = torch.from_numpy(pca.transform(digits.data)).float()
    scale = projected[train].norm(dim=1).mean()
    signs = torch.sign((projected * features).sum(0))  # each component is defined up to its sign
    torch.testing.assert_close(features, projected / scale * signs, rtol=1e-4, atol=1e-4)


def test_run_rejects_mlp_steps_and_unknown_experiments():
    with pytest.raises(ValueError, match="mlp_steps"):
        run_experiment("gd-icl", "features", mlp_steps=3, scale=TINY)
    with pytest.raises(ValueError, match="experiment must be one of"):
        run_experiment("gd-icl", "figure9", scale=TINY)
    with pytest.raises(ValueError, match="training_set must be one of"):
        gd_icl.SyntheticScale(training_set="fresh")


def test_loss_gradient_is_the_full_batch_gradient_with_its_standard_error_over_chunks():
    from hf_icl.reproduce.gd_icl.stationary import GIVEN, loss_gradient

    torch.manual_seed(0)
    model = GDTransformerForInContextClassification.from_gd_construction(2, 0.5, "softmax", torch.randn(4, 3).double(),
                                                                         n_dims=2)  # fmt: skip
    xs, ys = torch.randn(30, 5, 2, dtype=torch.float64), torch.randint(3, (30, 5))
    result = loss_gradient(model, xs, ys, n_context=4, chunks=3)
    names = [n for n, _ in model.named_parameters() if n not in GIVEN]
    params = dict(model.named_parameters())

    def gradient(rows):  # written out: autograd of the loss on these prompts, flattened in parameter order
        loss = model(xs[rows], ys[rows], n_context=4).loss
        return torch.cat([g.flatten() for g in torch.autograd.grad(loss, [params[n] for n in names])])

    chunks = torch.stack([gradient(slice(10 * c, 10 * c + 10)) for c in range(3)])
    # equal chunks: the mean of their gradients is the gradient of the mean loss over all 30 prompts
    torch.testing.assert_close(chunks.mean(0).norm().item(), gradient(slice(0, 30)).norm().item())
    assert result.gradient_norm == pytest.approx(float(gradient(slice(0, 30)).norm()), rel=1e-10)
    deviations = chunks - chunks.mean(0)
    standard_error = (deviations.square().sum(0) / 2 / 3).sqrt()  # sample variance (n − 1) over n chunks
    assert result.noise_floor == pytest.approx(float(standard_error.norm()), rel=1e-10)
    assert result.n_prompts == 30 and result.ratio == pytest.approx(result.gradient_norm / result.noise_floor)
    with pytest.raises(ValueError, match="chunks must be at most the number of prompts"):
        loss_gradient(model, xs[:2], ys[:2], n_context=4, chunks=3)


def test_the_control_is_the_construction_with_a_larger_step():
    from hf_icl.reproduce.gd_icl.stationary import with_step_size_scaled

    W_e = torch.randn(4, 3, dtype=torch.float64)
    model = GDTransformerForInContextClassification.from_gd_construction(2, 0.4, "rbf", W_e, n_dims=2)
    reference = GDTransformerForInContextClassification.from_gd_construction(2, 0.6, "rbf", W_e, n_dims=2)
    xs, ys = torch.randn(3, 6, 2, dtype=torch.float64), torch.randint(3, (3, 6))
    shifted = with_step_size_scaled(model, 1.5)
    with torch.no_grad():
        torch.testing.assert_close(shifted(xs, ys, n_context=5).logits, reference(xs, ys, n_context=5).logits)
        assert not torch.allclose(model(xs, ys, n_context=5).logits, reference(xs, ys, n_context=5).logits)
