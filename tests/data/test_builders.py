"""The ``datasets`` builder materialises exactly the sampler's stream, keyed by config and code."""

import datasets
import pytest
import torch

from hf_icl.data.builders import ICLTasks, split_seed
from hf_icl.data.tasks import get_task, iterate_prompts


def _build(tmp_path, **config):
    builder = ICLTasks(cache_dir=str(tmp_path / "cache"), **config)
    builder.download_and_prepare()
    return builder, builder.as_dataset().with_format("torch")


def _stream(family, n_prompts, n_points, seed, batch_size):
    chunks = list(iterate_prompts(family, n_prompts, n_points, seed=seed, batch_size=batch_size))
    xs = torch.cat([c[0] for c in chunks])
    ys = torch.cat([c[1] for c in chunks])
    params = {k: torch.cat([c[2][k] for c in chunks]) for k in chunks[0][2]}
    return xs, ys, params


@pytest.mark.parametrize("split", ["train", "validation", "test"])
def test_dataset_equals_sampler_stream(tmp_path, split):
    counts = {"train": 70, "validation": 30, "test": 25}
    builder, ds = _build(
        tmp_path,
        config_name="noisy_linear_regression",
        n_dims=4,
        n_points=9,
        n_prompts=counts,
        seed=3,
        batch_size=16,  # several chunks, the last one ragged
    )
    family = get_task("noisy_linear_regression", n_dims=4, noise_std=0.5, pool_seed=3)
    xs, ys, _ = _stream(family, counts[split], 9, split_seed(3, split), 16)
    rows = ds[split][:]
    assert torch.equal(rows["xs"], xs)
    assert torch.equal(rows["ys"], ys)
    assert torch.equal(rows["task_id"], torch.arange(counts[split]))  # fresh task per prompt


def test_pooled_tasks_store_pool_ids(tmp_path):
    _, ds = _build(
        tmp_path,
        config_name="linear_regression",
        n_dims=3,
        n_points=5,
        n_tasks=4,
        seed=1,
        n_prompts={"train": 40},
    )
    family = get_task("linear_regression", n_dims=3, n_tasks=4, pool_seed=1)
    xs, ys, params = _stream(family, 40, 5, split_seed(1, "train"), 1024)
    rows = ds["train"][:]
    assert torch.equal(rows["task_id"], params["task_id"])
    assert set(rows["task_id"].tolist()) <= {0, 1, 2, 3}
    # ys really come from the pooled weights: y = x · w[task_id]
    w = family.task_pool()["w"][rows["task_id"]]
    torch.testing.assert_close(rows["ys"], torch.einsum("bnd,bd->bn", rows["xs"], w))


def test_splits_are_distinct_streams(tmp_path):
    _, ds = _build(
        tmp_path,
        config_name="linear_regression",
        n_dims=3,
        n_points=5,
        n_prompts={"train": 20, "validation": 20, "test": 20},
    )
    firsts = [ds[s][:]["xs"] for s in ("train", "validation", "test")]
    assert not torch.equal(firsts[0], firsts[1])
    assert not torch.equal(firsts[1], firsts[2])
    assert len({split_seed(s, sp) for s in range(50) for sp in ("train", "validation", "test")}) == 150


def test_categorical_labels_are_integers(tmp_path):
    _, ds = _build(tmp_path, config_name="categorical", n_prompts={"train": 12})
    rows = ds["train"][:]
    assert rows["ys"].dtype == torch.int64
    assert rows["xs"].shape == (12, 10, 10)
    assert int(rows["ys"].min()) >= 0 and int(rows["ys"].max()) < 25


def test_for_family_copies_hyperparameters(tmp_path):
    family = get_task(
        "noisy_linear_regression", n_dims=2, noise_std=(0.1, 0.9), inputs={"name": "diagonal", "variances": [1, 4]}
    )
    builder = ICLTasks.for_family(family, n_points=6, n_prompts={"test": 8}, cache_dir=str(tmp_path))
    assert builder.config.build_family() == family
    builder.download_and_prepare()
    rows = builder.as_dataset()["test"].with_format("torch")[:]
    xs, ys, _ = _stream(family, 8, 6, split_seed(0, "test"), 1024)
    assert torch.equal(rows["xs"], xs) and torch.equal(rows["ys"], ys)


def test_cache_is_keyed_by_config_and_code(tmp_path):
    def cache_dir(**kw):
        return ICLTasks(cache_dir=str(tmp_path), config_name="linear_regression", **kw)._cache_dir

    assert cache_dir(seed=0) == cache_dir(seed=0)
    assert cache_dir(seed=0) != cache_dir(seed=1)
    assert cache_dir(n_points=5) != cache_dir(n_points=6)
    assert cache_dir(hash="code-a") != cache_dir(hash="code-b")


def test_cached_dataset_is_reused(tmp_path):
    kwargs = dict(config_name="linear_regression", n_dims=2, n_points=3, n_prompts={"train": 5})
    first, ds1 = _build(tmp_path, **kwargs)
    second = ICLTasks(cache_dir=str(tmp_path / "cache"), **kwargs)
    assert second._cache_dir == first._cache_dir
    second.download_and_prepare()  # finds the files, generates nothing new
    assert torch.equal(second.as_dataset().with_format("torch")["train"][:]["xs"], ds1["train"][:]["xs"])


def test_save_to_disk_round_trip(tmp_path):
    _, ds = _build(tmp_path, config_name="sinusoid", n_points=7, n_prompts={"train": 9, "test": 3})
    ds.save_to_disk(str(tmp_path / "saved"))
    loaded = datasets.load_from_disk(str(tmp_path / "saved")).with_format("torch")
    assert torch.equal(loaded["train"][:]["xs"], ds["train"][:]["xs"])
    assert torch.equal(loaded["test"][:]["ys"], ds["test"][:]["ys"])


@pytest.mark.parametrize(
    "overrides, match",
    [
        ({"family": "no_such_family"}, "family must be one of"),
        ({"n_prompts": {"training": 5}}, "n_prompts"),
        ({"n_prompts": {"train": 0}}, "n_prompts\\['train'\\]"),
        ({"n_points": 0}, "n_points"),
        ({"task_params": {"n_dims": 3}}, "n_dims"),
        ({"task_params": {"sparsity": 3}}, "sparsity"),
        ({"task_params": {"scale": -1.0}}, "scale"),
        ({"seed": -1}, "seed"),
    ],
)
def test_bad_config_fails_before_any_work(tmp_path, overrides, match):
    with pytest.raises(ValueError, match=match):
        ICLTasks(cache_dir=str(tmp_path), config_name="linear_regression", **overrides)
    assert not any(p.suffix == ".arrow" for p in tmp_path.rglob("*"))
