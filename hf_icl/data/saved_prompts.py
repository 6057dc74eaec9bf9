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
        if n_points > self.n_points:
            raise ValueError(f"n_points={n_points} is more than the {self.n_points} examples per prompt of {self.path}")
        if self.family_spec is None:
            raise ValueError(
                f"train_dataset={str(self.path)!r} does not record its task family (it was not written by ICLTasks), "
                "so its prompts cannot be checked against the task"
            )
        ignored = ("n_tasks", "pool_seed")
        saved = {k: v for k, v in self.family_spec.items() if k not in ignored}
        wanted = {k: v for k, v in json.loads(json.dumps(family_spec)).items() if k not in ignored}
        differing = sorted(k for k in set(saved) | set(wanted) if saved.get(k) != wanted.get(k))
        if differing:
            listed = ", ".join(f"{k}: dataset {saved.get(k)!r} vs arguments {wanted.get(k)!r}" for k in differing)
            raise ValueError(
                f"train_dataset={str(self.path)!r} holds prompts of another task than the training arguments "
                f"describe ({listed}); set task, task_params and n_dims to the dataset's"
            )


def _family_spec(description: str) -> dict[str, Any] | None:
    """The family JSON that ICLTasks writes at the end of its description (None if absent)."""
    if FAMILY_MARKER not in description:
        return None
    return json.loads(description.split(FAMILY_MARKER, 1)[1])
