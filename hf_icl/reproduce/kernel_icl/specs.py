"""The kernel-ICL study's definitions (seed 000): the sizes of a run, the groups of models trained together, what a
table's groups train on (the run cache's spec), and the model config of a group."""

from __future__ import annotations

from dataclasses import asdict, dataclass

PAPER = "kernel-icl"
#: the trivial predictor of the testability rule, as the tables and claims name it
TRIVIAL_LABEL = "trivial (zero predictor)"
#: Table-1 methods that are trained models (the rest are classical estimators: baselines to the rule)
TABLE1_MODELS = ("pretrained",)


@dataclass(frozen=True)
class Scale:
    """Sizes of a run; the defaults are the document's (its 1-D data seed 42 is the first seed)."""

    seeds: tuple[int, ...] = (42, 43, 44, 45, 46)
    hidden_size: int = 64
    learning_rate: float = 1e-3
    batch_size: int = 64
    # Table 1: the sin(x) prompt and the pre-trained head's training on random sinusoids
    context_points: int = 200
    query_points: int = 100
    noise_std: float = 0.2
    head_steps: int = 5000
    head_context: int = 40
    head_queries: int = 10
    rff_frequencies: int = 32
    rff_scale: float = 2.0
    # Table 2: ten features, three of them noisy copies of a latent
    n_dims: int = 10
    grid_steps: int = 10000
    grid_context: int = 100
    grid_queries: int = 20
    eval_tasks: int = 200
    eval_context: int = 200
    eval_queries: int = 50
    krr_bandwidth: float = 3.0
    krr_lam: float = 0.01
    curve_every: int = 50

    def describe(self) -> str:
        return (
            f"{len(self.seeds)} seeds {list(self.seeds)}; width {self.hidden_size}; Adam {self.learning_rate:g}, batch "
            f"{self.batch_size}; Table 1: {self.context_points} context / {self.query_points} query points, head "
            f"{self.head_steps} steps on {self.head_context}+{self.head_queries}-point prompts; Table 2: d = "
            f"{self.n_dims}, {self.grid_steps} steps on {self.grid_context}+{self.grid_queries}-point prompts, "
            f"{self.eval_tasks} held-out tasks of {self.eval_context}+{self.eval_queries} points per seed"
        )


#: the CPU default: the document's sizes except a quarter of Table 2's steps (its eight models × five seeds cost about
#: 0.75 s per step on one core of the 2-core VM, so 10,000 steps would take over an hour on both)
CPU = Scale(grid_steps=2500)
#: ``--full``: the document's sizes
FULL = Scale()


# -- training groups and the run cache's spec ----------------------------------------------------------------------
@dataclass(frozen=True)
class Group:
    """The seeds of one architecture, trained together as one stacked model."""

    name: str
    fields: dict


def group_model_config(scale: Scale, n_dims: int, row_kernel: str, column: bool, n_points: int) -> dict:
    """The :class:`~hf_icl.modeling.kernel_icl.KernelICLConfig` fields of a group's models."""
    return {
        "n_dims": n_dims,
        "n_points": n_points,
        "hidden_size": scale.hidden_size,
        "row_kernel": row_kernel,
        "use_column_attention": column,
    }


@dataclass(frozen=True)
class Training:
    """What every group of one table is trained on."""

    task: dict
    steps: int
    n_context: int
    n_queries: int

    def spec(self, scale: Scale, group: Group) -> dict:
        """The spec ``run.json`` records for ``group`` (:mod:`hf_icl.training.run_cache`): equal specs are reused."""
        return {
            "fields": group.fields,
            "seeds": list(scale.seeds),
            "batch_size": scale.batch_size,
            "learning_rate": scale.learning_rate,
            **asdict(self),
        }
