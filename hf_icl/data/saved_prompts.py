"""Training prompts from a saved :class:`~hf_icl.data.builders.ICLTasks` dataset: a finite pool.

``hf-icl dataset --save-to-disk DIR`` writes the prompts; ``hf-icl train --train_dataset DIR`` trains
on them, drawing each step's batch uniformly (with replacement) from the split. The dataset's
description records its task family, so a run on a dataset of another task fails before any work.

Example::

    >>> import tempfile, torch
    >>> from hf_icl.data.builders import ICLTasks
    >>> folder = tempfile.mkdtemp()
    >>> builder = ICLTasks(config_name="linear_regression", n_dims=3, n_points=6, n_prompts={"train": 10},
    ...                    cache_dir=folder)
    >>> builder.download_and_prepare()
    >>> builder.as_dataset().save_to_disk(folder + "/data")
    >>> prompts = SavedPrompts(folder + "/data")
    >>> xs, ys = prompts.sample(4, 5, generator=torch.Generator().manual_seed(0))
    >>> tuple(xs.shape), tuple(ys.shape), prompts.family_spec["name"]
    ((4, 5, 3), (4, 5), 'linear_regression')
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..validation import check_int

#: how ICLTasks' description introduces its family (a JSON object follows)
FAMILY_MARKER = "family: "


class SavedPrompts:
    """The ``split`` of a dataset saved with ``save_to_disk`` (an ``ICLTasks`` DatasetDict or one Dataset)."""

    def __init__(self, path: str | Path, split: str = "train"):
        import datasets

        path = Path(path).expanduser()
        if not (path / "dataset_dict.json").is_file() and not (path / "dataset_info.json").is_file():
            raise ValueError(
                f"train_dataset={str(path)!r} is not a dataset saved with save_to_disk (no dataset_dict.json nor "
                "dataset_info.json there); build one with `hf-icl dataset --save-to-disk DIR`"
            )
        loaded = datasets.load_from_disk(str(path))  # Arrow files: nothing is unpickled
        if isinstance(loaded, datasets.DatasetDict):
            if split not in loaded:
                raise ValueError(f"train_dataset_split={split!r} is not a split of {path}; it has {sorted(loaded)}")
            loaded = loaded[split]
        missing = {"xs", "ys"} - set(loaded.column_names)
        if missing:
            raise ValueError(
                f"train_dataset={str(path)!r} has no {sorted(missing)} column (columns: {loaded.column_names})"
            )
        self.path = path
        self.family_spec = _family_spec(loaded.info.description or "")
        columns = loaded.with_format("numpy")
        self.xs = torch.from_numpy(np.asarray(columns["xs"], dtype=np.float32))
        ys = np.asarray(columns["ys"])
        self.ys = torch.from_numpy(ys.astype(np.int64 if ys.dtype.kind in "iu" else np.float32))
        if self.xs.ndim != 3 or self.ys.shape != self.xs.shape[:2]:
            raise ValueError(
                f"train_dataset={str(path)!r}: xs must be (prompts, points, dims) and ys (prompts, points), got "
                f"{tuple(self.xs.shape)} and {tuple(self.ys.shape)}"
            )

    @property
    def n_prompts(self) -> int:
        return self.xs.shape[0]

    @property
    def n_points(self) -> int:
        return self.xs.shape[1]

    @property
    def n_dims(self) -> int:
        return self.xs.shape[2]

    def sample(
        self, batch_size: int, n_points: int, generator: torch.Generator, device: str | torch.device = "cpu"
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``batch_size`` prompts drawn uniformly with replacement, cut to their first ``n_points`` examples."""
        check_int("batch_size", batch_size, low=1)
        check_int("n_points", n_points, low=1, high=self.n_points)
        index = torch.randint(self.n_prompts, (batch_size,), generator=generator, device=generator.device).cpu()
        return self.xs[index, :n_points].to(device), self.ys[index, :n_points].to(device)

    def check_matches(self, family_spec: dict[str, Any], n_points: int) -> None:
        """Raise unless these prompts are of ``family_spec`` (pool aside) and at least ``n_points`` long."""
        check_prompts_match(self.path, self.family_spec, self.n_points, family_spec, n_points)


def check_prompts_match(
    path: Path, saved_spec: dict[str, Any] | None, saved_points: int, family_spec: dict[str, Any], n_points: int
) -> None:
    """Raise unless prompts saved at ``path`` (their family ``saved_spec``, ``saved_points`` long) are of
    ``family_spec`` (pool aside) and at least ``n_points`` long."""
    if n_points > saved_points:
        raise ValueError(f"n_points={n_points} is more than the {saved_points} examples per prompt of {path}")
    if saved_spec is None:
        raise ValueError(
            f"train_dataset={str(path)!r} does not record its task family (it was not written by ICLTasks), "
            "so its prompts cannot be checked against the task"
        )
    ignored = ("n_tasks", "pool_seed")
    saved = {k: v for k, v in saved_spec.items() if k not in ignored}
    wanted = {k: v for k, v in json.loads(json.dumps(family_spec)).items() if k not in ignored}
    differing = sorted(k for k in set(saved) | set(wanted) if saved.get(k) != wanted.get(k))
    if differing:
        listed = ", ".join(f"{k}: dataset {saved.get(k)!r} vs arguments {wanted.get(k)!r}" for k in differing)
        raise ValueError(
            f"train_dataset={str(path)!r} holds prompts of another task than the training arguments "
            f"describe ({listed}); set task, task_params and n_dims to the dataset's"
        )


def check_saved_dataset_early(path: str | Path, split: str, family_spec: dict[str, Any], n_points: int) -> None:
    """:func:`check_prompts_match` from the dataset's JSON metadata alone (its ``dataset_info.json``: the family in
    the description, the prompt length in the ``xs`` feature), before ``datasets`` is imported or any prompt read;
    metadata it cannot read is left to :class:`SavedPrompts`, which loads the prompts."""
    path = Path(path).expanduser()
    info = next((c for c in (path / split / "dataset_info.json", path / "dataset_info.json") if c.is_file()), None)
    try:
        meta = json.loads(info.read_text()) if info is not None else None
        points = int(meta["features"]["xs"]["shape"][0])
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return
    check_prompts_match(path, _family_spec(meta.get("description") or ""), points, family_spec, n_points)


def _family_spec(description: str) -> dict[str, Any] | None:
    """The family JSON that ICLTasks writes at the end of its description (None if absent)."""
    if FAMILY_MARKER not in description:
        return None
    return json.loads(description.split(FAMILY_MARKER, 1)[1])
