"""Reproduction of the linear vs softmax attention study (seed ``002``): Tables 1–3 and Figs. 1–3.

The document trains softmax GPT-2 (``gpt2_icl``) and causal linear attention with φ = ReLU² (``linear_gpt``) on
noiseless linear regression (d = 5, w ~ N(0, I), x ~ N(0, I), 10 points per prompt, the last one the query), at
depths 1, 3 and 6 (d_model 256, 4 heads, MLP 4×), five seeds each:

* softmax: Adam 1e-4, batches of 32, 30 000 steps; linear: Adam 3e-4, batches of 64, 7 500 / 8 000 / 10 000 steps;
  both: gradient clipping at 1.0 on the loss MSE/d over every position;
* test loss: the query's squared error / d; also on the anisotropic shift x ~ N(0, diag(0.5, 1, 1.5, 1, 1.75));
* convergence: samples seen (steps × batch) until 90 % of the gap between the initial and final test loss is closed.

Experiments (``hf-icl reproduce linear-attention EXPERIMENT``): ``table1`` (loss by depth, parameters), ``table2``
(the anisotropic shift), ``table3`` (convergence), ``all`` (the three from one set of runs), ``ablation`` (the
appendix's feature maps: identity, ReLU, the quadratic map and ReLU², each training the 6-layer linear model the same
way) and ``engines`` (how fast each way of training the seeds runs on this machine). The runs are shared: ``table2``
after ``table1`` trains nothing, and the ablation's ReLU² row is the 6-layer linear model of the tables.

Every claim is judged by the project's testability rule (:meth:`~hf_icl.reproduce.runs.Report.claim` with one
:class:`~hf_icl.reproduce.runs.Subject` per model the claim is about: its final test loss and the zero predictor's on
the same prompts): a claim about a model that learned nothing is "not testable at this size". Two checks of this
study come on top (:func:`testability`): a model still improving at the end of training, and one seed where a claim
needs an interval, also make a claim not testable.

Sizes: ``CPU`` (the default) keeps the task, depths, heads, learning rates, batch sizes and the ratio of the step
counts, at width 64, 3 seeds and a fifth of the steps, and is sized to finish in under 30 minutes on 2 cores (about
15 by an estimate from per-step timings); ``FULL`` (``--full``) is the document's (width 256, 5 seeds, its step
counts; many hours on a CPU). The seeds of one (architecture, depth) train in lockstep as one stacked model
(:class:`~hf_icl.reproduce.seed_ensemble.SeedEnsemble`), and the six groups run in single-thread processes, one per
core: ``engines`` times these choices against the package trainer.

Where the document leaves a detail open, the study's own code (``Yushgoel/icl-benchmarking``) decides, and
``docs/results/linear_attention.md`` lists each case: a fixed training set of 16 000 prompts sampled with
replacement, 4 000 test prompts, the test loss every 500 steps, 10 points in all per prompt.
"""

from __future__ import annotations

import functools
import json
import math
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import as_completed
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch
from safetensors.torch import save_file

from ..data.tasks import get_task
from ..evaluation.ood import ANISOTROPIC_VARIANCES, ood_task
from ..evaluation.plotting import new_panels, save_figure
from ..kernels.linear_attention import FEATURE_MAPS, feature_dim
from ..training.trainer import step_seed
from ..validation import check_choice
from .runs import (
    Experiment,
    Report,
    Subject,
    comparable,
    log,
    read_run_json,
    read_run_tensors,
    seed_interval,
    usable_cores,
)
from .seed_ensemble import SeedEnsemble, build_seeded
from .workers import worker_pool

PAPER = "linear-attention"
#: each finished group's per-prompt query errors (safetensors: nothing is unpickled)
ERRORS_FILE = "errors.safetensors"
#: the document's seeds ("42, 100, 7, 10, 2025"); ``--seed`` shifts every one of them
SEEDS = (42, 100, 7, 10, 2025)
DEPTHS = (1, 3, 6)
N_DIMS = 5
#: points per prompt, the query included (the study's code: ``n_samples=10``; the text's "k = 10 ... before the
#: final x_query" would make 11)
N_POINTS = 10
N_HEAD = 4
DOCUMENT_WIDTH = 256
#: GPT-2's vocabulary: the study's softmax model carries this unused token table, and its parameter counts include it
GPT2_VOCAB = 50257
#: the study's data seed (``np.random.seed(42)`` in its generate_data.py)
DATA_SEED = 42
#: share of the initial-to-final test-loss gap that counts as converged (Table 3)
CONVERGED = 0.9
#: a model "fails" at ICL above this test loss (the document: "test losses remaining above 0.7")
FAILED = 0.7
#: the anisotropic shift counts as small up to this relative increase of the test loss (the document's largest: 12.6 %)
SMALL_SHIFT = 0.2


# -- the document's numbers ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class DocumentRow:
    """One row of Table 1 or 2: parameters and (mean, ±) of the train, test and anisotropic test loss."""

    params: float
    train: tuple[float, float]
    test: tuple[float, float]
    anisotropic: tuple[float, float]


DOCUMENT = {
    "softmax": {
        1: DocumentRow(13.7e6, (0.7976, 0.0543), (0.8183, 0.0688), (0.8446, 0.0656)),
        3: DocumentRow(15.2e6, (0.0502, 0.0063), (0.0894, 0.0097), (0.0936, 0.0112)),
        6: DocumentRow(17.6e6, (0.0203, 0.0016), (0.0365, 0.0041), (0.0398, 0.0059)),
    },
    "linear": {
        1: DocumentRow(0.8e6, (0.5946, 0.0483), (0.7430, 0.0671), (0.7867, 0.0488)),
        3: DocumentRow(2.38e6, (0.0366, 0.0021), (0.0959, 0.0026), (0.1080, 0.0035)),
        6: DocumentRow(4.75e6, (0.0102, 0.0012), (0.0302, 0.0034), (0.0328, 0.0030)),
    },
}
#: Table 3: steps to 90 % convergence (samples = steps × batch size)
DOCUMENT_STEPS_TO_90 = {"softmax": {1: 7000, 3: 21500, 6: 25000}, "linear": {1: 4000, 3: 4000, 6: 7500}}

#: the appendix's feature-map ablation ("Linear Attention Feature Map"): the maps it tried, in its order, by the names
#: of :data:`hf_icl.kernels.linear_attention.FEATURE_MAPS` ("quadratic" is the appendix's [1, x_i, x_i x_j for i ≤ j])
ABLATION_MAPS = ("identity", "relu", "quadratic", "squared_relu")
#: φ of the linear recipe (``LinearGPTConfig``'s default), so the ablation's ReLU² row is the tables' linear model
DEFAULT_FEATURE_MAP = "squared_relu"
#: the ablation's depth: the only one the appendix names for it ("near 1 for even a 6 layer model")
ABLATION_DEPTH = 6
FEATURE_MAP_FORMULAS = {
    "identity": "x",
    "relu": "ReLU(x)",
    "quadratic": "[1, x_i, x_i x_j for i ≤ j]",
    "squared_relu": "ReLU(x)²",
}
#: what the document says of each map (it gives no numbers but identity's "near 1")
DOCUMENT_ABLATION = {
    "identity": "'extremely poorly', 'didn't learn at all': near 1, even at 6 layers",
    "relu": "an improvement over identity",
    "quadratic": "an improvement over identity",
    "squared_relu": "the best MSE; 'strictly dominating' ReLU (Sec. 2.2.2)",
}


# -- recipes and sizes ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Recipe:
    """How the document trains one architecture."""

    key: str
    label: str
    model_type: str
    learning_rate: float
    batch_size: int
    steps: tuple[int, ...]  # by depth, in DEPTHS order
    fields: tuple[tuple[str, object], ...] = ()
    #: the attention implementation under vmap (SDPA has no CPU batching rule; eager computes the same function)
    attn_implementation: str | None = None

    def steps_at(self, depth: int) -> int:
        return self.steps[DEPTHS.index(depth)]

    def model_fields(self, n_embd: int, depth: int) -> dict:
        shape = {"n_dims": N_DIMS, "n_points": N_POINTS, "target_kind": "regression"}
        return {**shape, "n_embd": n_embd, "n_layer": depth, "n_head": N_HEAD, **dict(self.fields)}


RECIPES = {
    "softmax": Recipe("softmax", "softmax (GPT-2)", "gpt2_icl", 1e-4, 32, (30_000, 30_000, 30_000), (), "eager"),
    # the study's linear model uses PyTorch's exact GELU; 20 tokens make the parallel form the cheapest mode
    "linear": Recipe(
        "linear",
        "linear attention",
        "linear_gpt",
        3e-4,
        64,
        (7_500, 8_000, 10_000),
        (("activation_function", "gelu"), ("linear_attention_mode", "parallel")),
    ),
}


@dataclass(frozen=True)
class Scale:
    """The size of a reproduction."""

    label: str
    full: bool
    n_embd: int
    seeds: tuple[int, ...]
    step_divisor: int  # the document's step counts are divided by this
    eval_steps: int  # steps between test-loss evaluations (the study's code: 500)
    train_pool: int | None  # fixed training prompts (the study's code: 16 000); None: fresh prompts every step
    test_prompts: int  # prompts in each evaluation set (the study's code: 4 000)
    train_eval_prompts: int  # training prompts scored for the "train loss" column (the study's code: 2 000)


FULL = Scale("full (the document's sizes)", True, DOCUMENT_WIDTH, SEEDS, 1, 500, 16_000, 4_000, 2_000)
CPU = Scale("CPU default", False, 64, SEEDS[:3], 5, 100, 16_000, 1_000, 500)


@dataclass(frozen=True)
class GroupSpec:
    """One architecture at one depth, every seed: the unit that trains as one :class:`SeedEnsemble`."""

    recipe: str
    depth: int
    n_embd: int
    seeds: tuple[int, ...]
    steps: int
    eval_steps: int
    train_pool: int | None
    test_prompts: int
    train_eval_prompts: int
    data_seed: int
    #: φ of a linear-attention group when it is not the recipe's own (the ablation); None: the recipe's
    feature_map: str | None = None

    def __post_init__(self):
        check_choice("recipe", self.recipe, list(RECIPES))
        if self.feature_map is None:
            return
        check_choice("feature_map", self.feature_map, FEATURE_MAPS)
        if RECIPES[self.recipe].model_type != "linear_gpt":
            raise ValueError(
                f"feature_map applies to the linear-attention recipe only, got recipe={self.recipe!r} with "
                f"feature_map={self.feature_map!r}; use feature_map=None"
            )
        if self.feature_map == DEFAULT_FEATURE_MAP:  # one name (and one run directory) per model
            object.__setattr__(self, "feature_map", None)

    @property
    def name(self) -> str:
        suffix = f"_{self.feature_map}" if self.feature_map else ""
        return f"{self.recipe}_L{self.depth}{suffix}"

    @property
    def feature_map_name(self) -> str | None:
        """φ of a linear-attention group (None for softmax)."""
        if RECIPES[self.recipe].model_type != "linear_gpt":
            return None
        return self.feature_map or DEFAULT_FEATURE_MAP

    @property
    def batch_size(self) -> int:
        return RECIPES[self.recipe].batch_size

    @property
    def learning_rate(self) -> float:
        return RECIPES[self.recipe].learning_rate

    def model_fields(self) -> dict:
        fields = RECIPES[self.recipe].model_fields(self.n_embd, self.depth)
        if self.feature_map is not None:
            fields["linear_attention_feature_map"] = self.feature_map
        return fields

    def cost(self) -> float:
        """Rough relative work, to start the longest groups first."""
        return self.steps * self.batch_size * self.depth * len(self.seeds) * (self.n_embd / 64) ** 2

    def to_dict(self) -> dict:
        values = {**asdict(self), "seeds": list(self.seeds)}
        if self.feature_map is None:  # the recipe's own map: the record (and so the reuse check) of earlier runs
            del values["feature_map"]
        return values

    @classmethod
    def from_dict(cls, values: dict) -> GroupSpec:
        return cls(**{**values, "seeds": tuple(values["seeds"])})


def group_specs(scale: Scale, seed: int = 0, steps: int | None = None) -> list[GroupSpec]:
    """The six groups (2 architectures × 3 depths) of a scale; ``seed`` shifts the seeds and the data, ``steps``
    replaces every step count."""
    specs = []
    for key, recipe in RECIPES.items():
        for depth in DEPTHS:
            n_steps = steps or max(1, recipe.steps_at(depth) // scale.step_divisor)
            specs.append(
                GroupSpec(
                    recipe=key,
                    depth=depth,
                    n_embd=scale.n_embd,
                    seeds=tuple(s + seed for s in scale.seeds),
                    steps=n_steps,
                    # at least 5 evaluations, so a short run still has a curve
                    eval_steps=max(1, min(scale.eval_steps, n_steps // 5)),
                    train_pool=scale.train_pool,
                    test_prompts=scale.test_prompts,
                    train_eval_prompts=scale.train_eval_prompts,
                    data_seed=DATA_SEED + seed,
                )
            )
    return specs


def ablation_specs(scale: Scale, seed: int = 0, steps: int | None = None) -> list[GroupSpec]:
    """The feature-map ablation: the :data:`ABLATION_DEPTH`-layer linear group of ``scale`` once per map of
    :data:`ABLATION_MAPS`, trained the same way (the ReLU² one is the tables' own group)."""
    base = next(s for s in group_specs(scale, seed, steps) if s.recipe == "linear" and s.depth == ABLATION_DEPTH)
    return [replace(base, feature_map=name) for name in ABLATION_MAPS]


# -- data ------------------------------------------------------------------------------------------------------
def study_task():
    """Noiseless linear regression, y = wᵀx with w ~ N(0, I_5) and x ~ N(0, I_5)."""
    return get_task("linear_regression", n_dims=N_DIMS)


def anisotropic_weight_prompts(
    n_prompts: int, n_points: int, seed: int, variances: Sequence[float] = ANISOTROPIC_VARIANCES, return_w=False
):
    """The shift the study's *code* evaluates (its generate_data.py): x ~ N(0, I), w ~ N(0, diag(variances)).
    The document's text puts the same variances on x instead (:func:`evaluation_sets`' ``anisotropic``)."""
    generator = torch.Generator().manual_seed(seed)
    xs = torch.randn(n_prompts, n_points, len(variances), generator=generator)
    w = torch.randn(n_prompts, len(variances), generator=generator) * torch.tensor(variances).sqrt()
    ys = torch.einsum("bnd,bd->bn", xs, w)
    return (xs, ys, w) if return_w else (xs, ys)


def training_prompts(spec: GroupSpec) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The fixed training set (the same for every seed and group), or None for fresh prompts every step."""
    if spec.train_pool is None:
        return None
    return study_task().sample(spec.train_pool, N_POINTS, seed=spec.data_seed)


def evaluation_sets(spec: GroupSpec) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """The prompts every model is scored on: the test set, the two anisotropic shifts, and training prompts."""
    task, n = study_task(), spec.test_prompts
    pool = training_prompts(spec)
    if pool is None:
        train = task.sample(spec.train_eval_prompts, N_POINTS, seed=spec.data_seed + 4)
    else:
        train = tuple(t[: spec.train_eval_prompts] for t in pool)
    return {
        "test": task.sample(n, N_POINTS, seed=spec.data_seed + 1),
        "anisotropic": ood_task(task, "anisotropic").sample(n, N_POINTS, seed=spec.data_seed + 2),
        "anisotropic_w": anisotropic_weight_prompts(n, N_POINTS, seed=spec.data_seed + 3),
        "train": train,
    }


def draw_batches(task, pool, batch_size: int, seeds: Sequence[int], step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One batch per seed, ``(S, B, N, d)`` and ``(S, B, N)``. Each seed's generator is seeded as the trainer seeds
    step ``step`` of a run with that seed, so with fresh prompts the batches are ``ICLTrainer``'s; with a pool, the
    batch is drawn from it with replacement, as the study's code does."""
    xs, ys = [], []
    for seed in seeds:
        generator = torch.Generator().manual_seed(step_seed(seed, 0, step))
        if pool is None:
            x, y = task.sample(batch_size, N_POINTS, generator=generator)
        else:
            index = torch.randint(pool[0].shape[0], (batch_size,), generator=generator)
            x, y = pool[0][index], pool[1][index]
        xs.append(x)
        ys.append(y)
    return torch.stack(xs), torch.stack(ys)


def query_errors(predictions: torch.Tensor, ys: torch.Tensor) -> torch.Tensor:
    """The document's test loss per prompt: the last (query) point's squared error / d, in float64."""
    return (predictions[..., -1].double() - ys[..., -1].double()).square() / N_DIMS


def trivial_errors(spec: GroupSpec) -> dict[str, float]:
    """The trivial predictor's loss on each evaluation set of ``spec``: ŷ = 0, the best prediction that ignores the
    context (E[y | x] = 0 for w ~ N(0, I)); about 1 isotropic and 1.15 anisotropic (E[y²]/d = tr Σ / d)."""
    return dict(_trivial_errors(spec.test_prompts, spec.train_pool, spec.train_eval_prompts, spec.data_seed))


@functools.cache
def _trivial_errors(test_prompts: int, train_pool: int | None, train_eval_prompts: int, data_seed: int) -> tuple:
    # the evaluation sets depend on these fields only; any recipe and depth gives the same prompts
    spec = GroupSpec("linear", 1, 8, (0,), 1, 1, train_pool, test_prompts, train_eval_prompts, data_seed)
    sets = evaluation_sets(spec)
    return tuple((name, float(query_errors(torch.zeros_like(ys), ys).mean())) for name, (_, ys) in sets.items())


# -- statistics --------------------------------------------------------------------------------------------------
def document_interval(residuals: Sequence[torch.Tensor]) -> float:
    """The document's rule (its appendix): concatenate the residuals of all seeds and take 1.96 · std (numpy's std,
    without the n − 1 correction). Here the residuals are the per-prompt query errors whose mean is the loss."""
    joined = torch.cat([torch.as_tensor(r, dtype=torch.float64).flatten() for r in residuals])
    return 1.96 * float(joined.std(correction=0))


def samples_to_converge(
    steps: Sequence[int], losses: Sequence[float], batch_size: int, fraction: float = CONVERGED
) -> int | None:
    """Samples seen (step × batch size) at the first evaluation whose loss closed ``fraction`` of the gap between the
    first (initial) and the last (final) loss; None when the loss never fell."""
    initial, final = float(losses[0]), float(losses[-1])
    if not final < initial:
        return None
    target = initial - fraction * (initial - final)
    for step, loss in zip(steps, losses, strict=True):
        if loss <= target:
            return int(step) * batch_size
    return None  # unreachable: the last loss meets the target


def plateaued(losses: Sequence[float], tail: float = 0.25, tolerance: float = 0.1) -> bool:
    """True when the loss fell by less than ``tolerance`` (relative) over the last ``tail`` of training: a model
    still improving at the end has no final loss or convergence point to compare yet."""
    losses = [float(v) for v in losses]
    start = losses[min(len(losses) - 1, math.floor((1 - tail) * (len(losses) - 1)))]
    return losses[-1] >= (1 - tolerance) * start


def separated(a: tuple[float, float], b: tuple[float, float]) -> bool:
    """True when two (mean, half-width) intervals do not overlap."""
    return abs(a[0] - b[0]) > a[1] + b[1]


# -- training ----------------------------------------------------------------------------------------------------
@dataclass
class GroupResult:
    """What one group's training measured: test/train curves and every final per-prompt error."""

    spec: GroupSpec
    steps: list[int]
    test_curve: torch.Tensor  # (S, evaluations)
    train_curve: torch.Tensor  # (S, evaluations)
    errors: dict[str, torch.Tensor]  # evaluation set -> (S, prompts) query errors of the final models
    seconds: float

    def final(self, name: str) -> torch.Tensor:
        """``(S,)`` final loss of every seed on an evaluation set."""
        return self.errors[name].mean(1)

    def interval(self, name: str) -> tuple[float, float]:
        mean, half = seed_interval(self.final(name))
        return float(mean), float(half)

    def mean_curve(self) -> torch.Tensor:
        return self.test_curve.mean(0)

    def samples(self) -> list[int]:
        return [s * self.spec.batch_size for s in self.steps]

    def samples_to_90(self) -> int | None:
        """Table 3's number, on the mean of the seeds' test curves."""
        return samples_to_converge(self.steps, self.mean_curve().tolist(), self.spec.batch_size)

    def samples_to_90_per_seed(self) -> list[int | None]:
        return [samples_to_converge(self.steps, c.tolist(), self.spec.batch_size) for c in self.test_curve]

    def plateaued(self) -> bool:
        return plateaued(self.mean_curve().tolist())

    def trivial(self, name: str = "test") -> float:
        """The trivial (zero) predictor's loss on the same prompts as :meth:`final`."""
        return trivial_errors(self.spec)[name]

    def subject(self, name: str = "test") -> Subject:
        """This group (the mean over seeds of its final loss on evaluation set ``name``) for the testability rule."""
        label = self.spec.name if name == "test" else f"{self.spec.name} ({name})"
        return Subject(label, float(self.final(name).mean()), self.trivial(name))

    def save(self, run_dir: Path) -> None:
        run_dir.mkdir(parents=True, exist_ok=True)
        save_file({k: v.contiguous() for k, v in self.errors.items()}, run_dir / ERRORS_FILE)  # no pickle
        record = {
            "spec": self.spec.to_dict(),
            "steps": self.steps,
            "test_curve": self.test_curve.tolist(),
            "train_curve": self.train_curve.tolist(),
            "seconds": self.seconds,
        }
        (run_dir / "run.json").write_text(json.dumps(record))  # last: its presence marks a finished run

    @classmethod
    def load(cls, run_dir: Path) -> GroupResult:
        record = read_run_json(run_dir / "run.json")
        return cls(
            GroupSpec.from_dict(record["spec"]),
            record["steps"],
            torch.tensor(record["test_curve"], dtype=torch.float64),
            torch.tensor(record["train_curve"], dtype=torch.float64),
            read_run_tensors(run_dir / ERRORS_FILE),
            record["seconds"],
        )


def _score(ensemble: SeedEnsemble, prompts: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    xs, ys = prompts
    return query_errors(ensemble.predict(xs, ys), ys)


def train_group(spec: GroupSpec, run_dir: Path, log_every: float = 30.0) -> GroupResult:
    """Train every seed of ``spec`` in lockstep, scoring the test and training prompts at step 0 and every
    ``eval_steps`` steps; save the result and one ``save_pretrained`` model per seed to ``run_dir``."""
    recipe = RECIPES[spec.recipe]
    ensemble = SeedEnsemble(
        recipe.model_type,
        spec.model_fields(),
        spec.seeds,
        spec.learning_rate,
        attn_implementation=recipe.attn_implementation,
    )
    task, pool, sets = study_task(), training_prompts(spec), evaluation_sets(spec)
    steps, test, train = [], [], []

    def record(step: int) -> None:
        steps.append(step)
        test.append(_score(ensemble, sets["test"]).mean(1))
        train.append(_score(ensemble, sets["train"]).mean(1))

    log(
        f"training {spec.name}: {recipe.model_type}, {len(spec.seeds)} seeds × {spec.steps} steps × "
        f"{spec.batch_size} prompts, width {spec.n_embd} (pid {os.getpid()}, {torch.get_num_threads()} threads)"
    )
    started = last_log = time.perf_counter()
    record(0)
    for step in range(spec.steps):
        ensemble.step(*draw_batches(task, pool, spec.batch_size, spec.seeds, step))
        done = step + 1
        if done % spec.eval_steps == 0 or done == spec.steps:
            record(done)
            now = time.perf_counter()
            if now - last_log >= log_every and done < spec.steps:
                last_log = now
                rate = done / (now - started)
                log(
                    f"  {spec.name}: step {done}/{spec.steps} ({rate:.1f} steps/s, about "
                    f"{(spec.steps - done) / rate / 60:.1f} min left), test loss {float(test[-1].mean()):.4f}"
                )
    result = GroupResult(
        spec,
        steps,
        torch.stack(test, 1),
        torch.stack(train, 1),
        {name: _score(ensemble, prompts) for name, prompts in sets.items()},
        time.perf_counter() - started,
    )
    ensemble.save_models(run_dir)
    result.save(run_dir)
    log(f"  {spec.name} done in {result.seconds / 60:.1f} min, test loss {float(result.final('test').mean()):.4f}")
    return result


def _finished(spec: GroupSpec, run_dir: Path) -> bool:
    saved = run_dir / "run.json"
    # a run from before the errors moved to safetensors (errors.pt) is trained again, never unpickled
    finished = saved.is_file() and (run_dir / ERRORS_FILE).is_file()
    return finished and json.loads(saved.read_text())["spec"] == spec.to_dict()


def _train_in_worker(spec: dict, run_dir: str, threads: int) -> str:
    """Entry point of a worker process (one per core by default)."""
    torch.set_num_threads(threads)
    train_group(GroupSpec.from_dict(spec), Path(run_dir))
    return spec["recipe"] + f"_L{spec['depth']}"


def run_groups(
    specs: Sequence[GroupSpec], runs_dir: Path, *, retrain: bool = False, workers: int | None = None
) -> dict[str, GroupResult]:
    """Train the groups not already finished with the same spec (``retrain``: all of them), longest first, in
    ``workers`` processes (default: one per core, each with one thread; 1: in this process); load every result."""
    todo = [s for s in specs if retrain or not _finished(s, runs_dir / s.name)]
    for spec in specs:
        if spec not in todo:
            log(f"reusing {runs_dir / spec.name} (trained with the same settings)")
    todo.sort(key=GroupSpec.cost, reverse=True)
    workers = min(workers or usable_cores(), len(todo))
    if todo:
        log(f"{len(todo)} group(s) to train: {', '.join(s.name for s in todo)}")
    if workers <= 1:
        for spec in todo:
            train_group(spec, runs_dir / spec.name)
    else:
        threads = max(1, usable_cores() // workers)
        log(f"{len(todo)} groups in {workers} processes × {threads} threads")
        with worker_pool(workers) as pool:
            jobs = [pool.submit(_train_in_worker, s.to_dict(), str(runs_dir / s.name), threads) for s in todo]
            for job in as_completed(jobs):
                job.result()  # re-raises a worker's error here
    return {spec.name: GroupResult.load(runs_dir / spec.name) for spec in specs}


def parameter_counts(n_embd: int = DOCUMENT_WIDTH) -> dict[str, dict[int, dict[str, int]]]:
    """Trainable parameters of our models, and the same models counted as the study's code counts them: its
    softmax model is transformers' ``GPT2Model`` with GPT-2's 50 257-token table (unused: prompts enter through the
    read-in, yet counted), its linear model has no final LayerNorm."""
    counts = {}
    for key, recipe in RECIPES.items():
        counts[key] = {}
        for depth in DEPTHS:
            model = build_seeded(recipe.model_type, recipe.model_fields(n_embd, depth), 0)
            ours = sum(p.numel() for p in model.parameters() if p.requires_grad)
            study = ours + GPT2_VOCAB * n_embd if key == "softmax" else ours - 2 * n_embd
            counts[key][depth] = {"trainable": ours, "as_the_study_counts": study}
    return counts


# -- the experiments -----------------------------------------------------------------------------------------------
@dataclass
class Context:
    """Where an experiment writes, at which scale, and the shared runs."""

    scale: Scale
    output_dir: Path
    runs_dir: Path
    report: Report
    seed: int = 0
    retrain: bool = False
    steps: int | None = None
    workers: int | None = None
    _results: dict | None = field(default=None, repr=False)
    _ablation: dict | None = field(default=None, repr=False)

    def specs(self) -> list[GroupSpec]:
        return group_specs(self.scale, self.seed, self.steps)

    def ablation(self) -> dict[str, GroupResult]:
        """The feature-map ablation's groups by map name (:func:`ablation_specs`), trained once (or reused)."""
        if self._ablation is None:
            specs = ablation_specs(self.scale, self.seed, self.steps)
            loaded = run_groups(specs, self.runs_dir, retrain=self.retrain, workers=self.workers)
            self._ablation = {s.feature_map_name: loaded[s.name] for s in specs}
            self.report.numbers.setdefault("runs", {}).update(
                {r.spec.name: {"seconds": r.seconds, "spec": r.spec.to_dict()} for r in loaded.values()}
            )
        return self._ablation

    def results(self) -> dict[tuple[str, int], GroupResult]:
        """Every group's result, trained once (or reused) for all the experiments of this call."""
        if self._results is None:
            loaded = run_groups(self.specs(), self.runs_dir, retrain=self.retrain, workers=self.workers)
            self._results = {(r.spec.recipe, r.spec.depth): r for r in loaded.values()}
            self.report.numbers["runs"] = {
                r.spec.name: {"seconds": r.seconds, "spec": r.spec.to_dict()} for r in loaded.values()
            }
        return self._results

    def add_runs_note(self, runs: Sequence[GroupResult] | None = None) -> None:
        """Close the report with where the runs are and how long each took (default: the tables' runs)."""
        runs = list(self.results().values()) if runs is None else runs
        self.report.add(
            "Runs (each group trains all its seeds as one stacked model; a reused run keeps its first time): "
            + ", ".join(f"{r.spec.name} {r.seconds / 60:.1f} min" for r in runs)
            + f"; up to {self.workers or usable_cores()} training processes on {usable_cores()} cores. "
            f"Models: `{self.runs_dir}/GROUP/seedN` (save_pretrained)."
        )


def _pm(mean: float, half: float, digits: int = 4) -> str:
    return f"{mean:.{digits}f}" if math.isnan(half) else f"{mean:.{digits}f} ± {half:.{digits}f}"


def _table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _layers(depth: int) -> str:
    return f"{depth} layer{'s' if depth > 1 else ''}"


def _percent(change: float) -> str:
    return f"{100 * change:+.1f} %"


def _samples(value: int | None) -> str:
    return "never" if value is None else f"{value:,}"


@dataclass(frozen=True)
class Testability:
    """This study's checks on top of the testability rule: whether a claim can be judged, and the note why not."""

    ok: bool
    note: str


def testability(results: dict, keys: Sequence, *, intervals: bool = False) -> Testability:
    """The checks this study adds to the rule (whether a model learned anything is the rule's, by
    :func:`subjects`): a claim about the models ``keys`` needs each of them to have stopped improving (a model still
    improving at the end has no final loss or convergence point to compare yet) and, for claims about uncertainty,
    at least two seeds."""
    still = [results[k].spec.name for k in keys if not results[k].plateaued()]
    few = [results[k].spec.name for k in keys if intervals and len(results[k].spec.seeds) < 2]
    notes = [
        f"{what}: {', '.join(names)}"
        for what, names in (("still improving at the end", still), ("one seed, no interval", few))
        if names
    ]
    return Testability(not notes, f" ({'; '.join(notes)})" if notes else "")


def subjects(results: dict, keys: Sequence, name: str = "test") -> list[Subject]:
    """The models ``keys`` as the testability rule's subjects: each one's final loss on evaluation set ``name``
    (mean over seeds) and the trivial predictor's on the same prompts."""
    return [results[k].subject(name) for k in keys]


def _loss_tables(ctx: Context, results: dict) -> None:
    """Tables 1 and 2: train and test loss by depth, ours beside the document's, and how the ± were computed."""
    rows, numbers = [], {}
    for key, recipe in RECIPES.items():
        for depth in DEPTHS:
            r, doc = results[key, depth], DOCUMENT[key][depth]
            rows.append(
                (
                    recipe.label,
                    depth,
                    _pm(*doc.train),
                    _pm(*r.interval("train")),
                    _pm(*doc.test),
                    _pm(*r.interval("test")),
                )
            )
            numbers[r.spec.name] = {
                name: {"per_seed": r.final(name).tolist(), "mean_ci95": r.interval(name)} for name in r.errors
            }
    ctx.report.numbers["losses"] = numbers
    ctx.report.add(
        "Tables 1–2: train and test loss (query error / d) by depth. Ours: mean over seeds ± the 95 % t interval "
        "of that mean. The document's ± are its own.\n\n"
        + _table(("model", "depth", "train (doc)", "train (ours)", "test (doc)", "test (ours)"), rows)
    )
    ctx.report.add(_interval_table(results))


def _interval_table(results: dict) -> str:
    """The test-loss ± of every group under four rules, to show which one the document's ± can come from."""
    rows = []
    for (key, depth), r in results.items():
        per_seed = r.final("test")
        n = per_seed.numel()
        std0 = float(per_seed.std(correction=0))
        rows.append(
            (
                RECIPES[key].label,
                depth,
                f"{DOCUMENT[key][depth].test[1]:.4f}",
                f"{document_interval(list(r.errors['test'])):.4f}",
                f"{r.interval('test')[1]:.4f}",
                f"{1.96 * std0 / math.sqrt(n):.4f}",
                f"{std0:.4f}",
            )
        )
    return (
        "Test-loss ± by rule: the document's appendix (1.96 · std of all seeds' per-prompt errors, concatenated); "
        "the t interval of the seed mean (ours, used in every verdict); the study code's plots (1.96 · std / √n over "
        "seeds) and its printed table (std of the seed means).\n\n"
        + _table(
            ("model", "depth", "document's ±", "appendix rule", "t interval", "code's plots", "code's table"), rows
        )
    )


def _parameter_section(ctx: Context) -> None:
    counts = parameter_counts()
    ctx.report.numbers["parameters"] = counts
    rows = [
        (
            RECIPES[key].label,
            depth,
            f"{DOCUMENT[key][depth].params / 1e6:.2f} M",
            f"{c['trainable']:,}",
            f"{c['as_the_study_counts']:,}",
        )
        for key, by_depth in counts.items()
        for depth, c in by_depth.items()
    ]
    ctx.report.add(
        f"Parameters at the document's width {DOCUMENT_WIDTH}: our trainable parameters, and the same models counted "
        "as the study's code counts them (GPT-2's unused 50 257 × d_model token table included in the softmax model; "
        "no final LayerNorm in its linear model).\n\n"
        + _table(("model", "depth", "document", "ours (trainable)", "counted as the study does"), rows)
    )
    soft, lin = counts["softmax"], counts["linear"]
    ratio = max(soft[d]["trainable"] / lin[d]["trainable"] for d in DEPTHS)
    ctx.report.claim(
        "linear-attention models have far fewer parameters than softmax ones",
        "0.8 / 2.38 / 4.75 M vs 13.7 / 15.2 / 17.6 M; the faster convergence is put down to the 'reduced parameter "
        "count'",
        "trainable: "
        + ", ".join(
            f"{_layers(d)} {lin[d]['trainable'] / 1e6:.2f} M vs {soft[d]['trainable'] / 1e6:.2f} M" for d in DEPTHS
        )
        + f" (at most {ratio:.3f}×); the document's numbers are GPT-2's unused token table: counted with it, "
        + ", ".join(f"{soft[d]['as_the_study_counts'] / 1e6:.2f} M" for d in DEPTHS),
        bool(ratio > 2),
    )


def _claim(
    ctx: Context,
    claim: str,
    document: str,
    measured: str,
    ok: bool | None,
    test: Testability,
    about: Sequence[Subject],
) -> None:
    """Judge a claim about the models ``about`` (the rule) with this study's checks ``test`` on top."""
    ctx.report.claim(claim, document, measured + test.note, ok if test.ok else None, about)


def _depth_claims(ctx: Context, results: dict, name: str, claim: str, document: str) -> None:
    """Loss on evaluation set ``name`` falls 1 → 3 → 6 layers for both architectures (every model must have learned
    something on that set)."""
    means = {key: [float(results[key, d].final(name).mean()) for d in DEPTHS] for key in RECIPES}
    drops = {key: [1 - means[key][i + 1] / means[key][i] for i in range(len(DEPTHS) - 1)] for key in RECIPES}
    keys = [(k, d) for k in RECIPES for d in DEPTHS]
    _claim(
        ctx,
        claim,
        document,
        "; ".join(
            f"{RECIPES[k].label}: "
            + " → ".join(f"{v:.4f}" for v in means[k])
            + " ("
            + ", ".join(f"{-100 * x:+.0f} %" for x in drops[k])
            + ")"
            for k in RECIPES
        ),
        all(v[0] > v[1] > v[2] for v in means.values()),
        testability(results, keys),
        subjects(results, keys, name),
    )


def _isotropic_claims(ctx: Context, results: dict) -> None:
    _depth_claims(
        ctx,
        results,
        "test",
        "H3: test loss falls with depth (1 → 3 → 6) for both architectures",
        "softmax −89 %, −59 %; linear −87 %, −68 %",
    )
    one = [("softmax", 1), ("linear", 1)]
    ones = {k: results[k].interval("test") for k in one}
    _claim(
        ctx,
        "one-layer models fail at ICL: test loss above 0.7 for both",
        "softmax 0.8183, linear 0.7430",
        ", ".join(f"{RECIPES[k].label} {_pm(*v)}" for (k, _), v in ones.items()),
        all(v[0] > FAILED for v in ones.values()),
        testability(results, one),
        # the one-layer models must have learned something (the document's did: 0.74 and 0.82 against 1), and a
        # failure only counts where the same budget taught the deepest models
        subjects(results, [*one, *((k, DEPTHS[-1]) for k in RECIPES)]),
    )
    _claim(
        ctx,
        "1 layer: linear attention's test loss is below softmax's",
        "0.7430 vs 0.8183 (Table 2 vs 1; the text says softmax 'slightly outperforms' with the same numbers)",
        f"linear {_pm(*ones[one[1]])}, softmax {_pm(*ones[one[0]])}",
        ones[one[1]][0] < ones[one[0]][0],
        testability(results, one),
        subjects(results, one),
    )
    per_depth = {d: (results["softmax", d].interval("test"), results["linear", d].interval("test")) for d in DEPTHS}
    keys = [(k, d) for k in RECIPES for d in DEPTHS]
    _claim(
        ctx,
        "H1: softmax attention reaches a lower test loss than linear attention (at every depth, beyond the "
        "seeds' uncertainty)",
        "not supported: at 6 layers linear is lower (0.0302 vs 0.0365), within uncertainty",
        "; ".join(f"{_layers(d)}: softmax {_pm(*s)} vs linear {_pm(*lin)}" for d, (s, lin) in per_depth.items()),
        all(s[0] < lin[0] and separated(s, lin) for s, lin in per_depth.values()),
        testability(results, keys, intervals=True),
        subjects(results, keys),
    )
    six = [("softmax", 6), ("linear", 6)]
    s6, l6 = per_depth[6]
    _claim(
        ctx,
        "6 layers: softmax and linear attention are comparable (intervals overlap)",
        "0.0365 ± 0.0041 vs 0.0302 ± 0.0034: linear marginally lower, within uncertainty",
        f"softmax {_pm(*s6)}, linear {_pm(*l6)}; lower: {'linear' if l6[0] < s6[0] else 'softmax'}",
        not separated(s6, l6),
        testability(results, six, intervals=True),
        subjects(results, six),
    )


def _shift_section(ctx: Context, results: dict) -> None:
    """The anisotropic columns of Tables 1–2 and Fig. 3, with the study code's variant of the shift beside."""
    rows, degradation = [], {}
    for key, recipe in RECIPES.items():
        for depth in DEPTHS:
            r, doc = results[key, depth], DOCUMENT[key][depth]
            iso, aniso, aniso_w = (float(r.final(n).mean()) for n in ("test", "anisotropic", "anisotropic_w"))
            degradation[key, depth] = aniso / iso - 1
            rows.append(
                (
                    recipe.label,
                    depth,
                    f"{doc.test[0]:.4f} → {_pm(*doc.anisotropic)} ({_percent(doc.anisotropic[0] / doc.test[0] - 1)})",
                    f"{iso:.4f} → {_pm(*r.interval('anisotropic'))} ({_percent(degradation[key, depth])})",
                    f"{aniso_w:.4f} ({_percent(aniso_w / iso - 1)})",
                )
            )
    ctx.report.numbers["anisotropic_degradation"] = {f"{k}_L{d}": v for (k, d), v in degradation.items()}
    ctx.report.add(
        "Anisotropic shift: test loss isotropic → x ~ N(0, diag(0.5, 1, 1.5, 1, 1.75)) (the document), and our models "
        "on the study code's variant (the same variances on w, x ~ N(0, I)).\n\n"
        + _table(("model", "depth", "document", "ours", "ours, shift on w (code)"), rows)
    )
    keys = [(k, d) for k in RECIPES for d in DEPTHS]
    _claim(
        ctx,
        "H2: softmax attention degrades less than linear attention under the anisotropic shift (at every depth)",
        "partly: 1 layer +3.2 % vs +5.9 %, 3 layers +4.7 % vs +12.6 %, 6 layers +9.0 % vs +8.6 %",
        ", ".join(
            f"{_layers(d)} {_percent(degradation['softmax', d])} vs {_percent(degradation['linear', d])}"
            for d in DEPTHS
        ),
        all(degradation["softmax", d] < degradation["linear", d] for d in DEPTHS),
        testability(results, keys),
        subjects(results, keys),  # a degradation means something only for a model that learned the task
    )
    worst = max(degradation.values())
    _claim(
        ctx,
        f"the anisotropic shift costs little for every model (at most +{100 * SMALL_SHIFT:.0f} %)",
        "'negligible' degradation; at most +12.6 % (linear, 3 layers)",
        f"largest {_percent(worst)}",
        worst <= SMALL_SHIFT,
        testability(results, keys),
        subjects(results, keys),
    )
    _depth_claims(
        ctx,
        results,
        "anisotropic",
        "H3: anisotropic test loss falls with depth for both architectures",
        "softmax 0.8446 → 0.0936 → 0.0398; linear 0.7867 → 0.1080 → 0.0328",
    )


def _convergence_section(ctx: Context, results: dict) -> None:
    """Table 3: samples seen until 90 % of the initial-to-final test-loss gap is closed (mean curve of the seeds)."""
    rows, samples = [], {}
    for key, recipe in RECIPES.items():
        for depth in DEPTHS:
            r = results[key, depth]
            doc_steps = DOCUMENT_STEPS_TO_90[key][depth]
            samples[key, depth] = r.samples_to_90()
            rows.append(
                (
                    recipe.label,
                    depth,
                    recipe.batch_size,
                    f"{doc_steps:,} / {doc_steps * recipe.batch_size:,}",
                    f"{r.spec.steps:,}",
                    "never" if samples[key, depth] is None else f"{samples[key, depth] // recipe.batch_size:,}",
                    _samples(samples[key, depth]),
                    ", ".join(_samples(s) for s in r.samples_to_90_per_seed()),
                )
            )
    ctx.report.numbers["samples_to_90"] = {
        f"{k}_L{d}": {"mean_curve": v, "per_seed": results[k, d].samples_to_90_per_seed()}
        for (k, d), v in samples.items()
    }
    ctx.report.add(
        "Table 3: steps / samples seen to close 90 % of the gap between the initial (step 0) and final test loss, on "
        "the mean of the seeds' test curves (per seed in the last column).\n\n"
        + _table(
            (
                "model",
                "depth",
                "batch",
                "document: steps / samples",
                "our steps",
                "ours: steps",
                "ours: samples",
                "per seed",
            ),
            rows,
        )
    )
    keys = [(k, d) for k in RECIPES for d in DEPTHS]
    ratio = {d: (samples["softmax", d] or math.inf) / (samples["linear", d] or math.inf) for d in DEPTHS}
    measured = ", ".join(
        f"{_layers(d)} {_samples(samples['linear', d])} vs {_samples(samples['softmax', d])}" for d in DEPTHS
    )
    _claim(
        ctx,
        "H4: linear attention converges in fewer samples than softmax attention (at every depth)",
        "holds at 3 and 6 layers (256k vs 688k, 480k vs 800k); at 1 layer its own Table 3 says the opposite "
        "(256k vs 224k)",
        measured,
        all(r > 1 for r in ratio.values()),
        testability(results, keys),
        subjects(results, keys),
    )
    six = [("softmax", 6), ("linear", 6)]
    _claim(
        ctx,
        "6 layers: linear attention needs about 1.6× fewer samples (within 1.5× of 1.67×)",
        "800k / 480k ≈ 1.67×",
        f"{ratio[6]:.2f}×",
        1 < ratio[6] < math.inf and comparable(ratio[6], 800 / 480),
        testability(results, six),
        subjects(results, six),
    )
    deep = [("linear", 3), ("linear", 6)]
    _claim(
        ctx,
        "deeper linear models take longer to converge (6 vs 3 layers)",
        "256k (3 layers) vs 480k (6 layers) samples",
        f"{_samples(samples['linear', 3])} vs {_samples(samples['linear', 6])}",
        (samples["linear", 6] or 0) > (samples["linear", 3] or math.inf),
        testability(results, deep),
        subjects(results, deep),
    )


# -- plots ---------------------------------------------------------------------------------------------------------
def _samples_axis(ax) -> None:
    """Samples seen in thousands (full numbers overlap on a panel a third of a page wide)."""
    from matplotlib.ticker import FuncFormatter

    ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value / 1000:g}k" if value else "0"))
    ax.set_xlabel("samples seen (steps × batch)")


def plot_curves(path: Path, results: dict) -> Path:
    """Figs. 1–2 side by side: test (solid, 95 % t band over seeds) and train (dashed) loss against samples seen,
    one panel per depth, both architectures in each."""
    fig, axes = new_panels(len(DEPTHS), (5.0 * len(DEPTHS), 4.0))
    for ax, depth in zip(axes, DEPTHS, strict=True):
        shown = []
        for i, (key, recipe) in enumerate(RECIPES.items()):
            r, color = results[key, depth], f"C{i}"
            mean, half = seed_interval(r.test_curve)
            half = torch.nan_to_num(half)
            train = r.train_curve.mean(0)
            ax.plot(r.samples(), mean.tolist(), color=color, label=f"{recipe.label}, test")
            ax.fill_between(r.samples(), (mean - half).tolist(), (mean + half).tolist(), color=color, alpha=0.2)
            ax.plot(r.samples(), train.tolist(), "--", color=color, label=f"{recipe.label}, train")
            shown += [mean, train]
        # the axis follows the curves: a wide band (few seeds) may leave it, and a log axis cannot show its negative end
        values = torch.cat(shown)
        ax.set_yscale("log")
        ax.set_ylim(0.5 * float(values.min().clamp_min(1e-8)), 2 * float(values.max()))
        ax.set_title(_layers(depth))
        _samples_axis(ax)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("query squared error / d")
    axes[0].legend(fontsize=8)
    return save_figure(fig, path)


def plot_shift(path: Path, results: dict) -> Path:
    """Fig. 3: isotropic vs anisotropic test loss by depth, both architectures (bars: seed means, whiskers: 95 % t)."""
    fig, (ax,) = new_panels(1, (7.0, 4.2))
    bars = [(key, name) for key in RECIPES for name in ("test", "anisotropic")]
    width, heights = 0.8 / len(bars), []
    for i, (key, name) in enumerate(bars):
        stats = [results[key, d].interval(name) for d in DEPTHS]
        x = [j + (i - (len(bars) - 1) / 2) * width for j in range(len(DEPTHS))]
        label = f"{RECIPES[key].label}, {'isotropic' if name == 'test' else 'anisotropic'}"
        errors = [0 if math.isnan(h) else h for _, h in stats]
        style = {"color": f"C{list(RECIPES).index(key)}", "hatch": "//" if name != "test" else ""}
        ax.bar(x, [m for m, _ in stats], width, yerr=errors, capsize=3, label=label, **style)
        heights += [m for m, _ in stats]
    ax.set_xticks(range(len(DEPTHS)), [_layers(d) for d in DEPTHS])
    ax.set_yscale("log")
    ax.set_ylim(0.5 * max(min(heights), 1e-8), 2 * max(heights))
    ax.set_ylabel("query squared error / d")
    ax.grid(True, axis="y", which="both", alpha=0.3)
    ax.legend(fontsize=8)
    return save_figure(fig, path)


def plot_ablation(path: Path, ablation: dict[str, GroupResult]) -> Path:
    """The feature-map ablation: each map's test loss (95 % t band over seeds) against samples seen, with the trivial
    predictor's loss as a dotted line."""
    fig, (ax,) = new_panels(1, (7.0, 4.2))
    shown = []
    for i, (name, r) in enumerate(ablation.items()):
        mean, half = seed_interval(r.test_curve)
        half = torch.nan_to_num(half)
        label = f"{name}: φ(x) = {FEATURE_MAP_FORMULAS[name]}"
        ax.plot(r.samples(), mean.tolist(), color=f"C{i}", label=label)
        ax.fill_between(r.samples(), (mean - half).tolist(), (mean + half).tolist(), color=f"C{i}", alpha=0.2)
        shown.append(mean[torch.isfinite(mean)])
    trivial = next(iter(ablation.values())).trivial("test")
    ax.axhline(trivial, color="gray", linestyle=":", label=f"trivial predictor (ŷ = 0): {trivial:.3f}")
    values = torch.cat([*shown, torch.tensor([trivial], dtype=torch.float64)])
    ax.set_yscale("log")
    ax.set_ylim(0.5 * float(values.min().clamp_min(1e-8)), 2 * float(values.max()))
    ax.set_title(f"feature maps, linear attention, {_layers(ABLATION_DEPTH)}")
    _samples_axis(ax)
    ax.set_ylabel("query squared error / d")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    return save_figure(fig, path)


def _curves_plot(ctx: Context, results: dict) -> None:
    path = plot_curves(ctx.report.plot_path("curves"), results)
    ctx.report.add_plot(path, "Figs. 1–2: test (solid, 95 % band over seeds) and train (dashed) loss by depth")


# -- experiments ---------------------------------------------------------------------------------------------------
def table1(ctx: Context) -> None:
    results = ctx.results()
    _isotropic_claims(ctx, results)
    _parameter_section(ctx)
    _loss_tables(ctx, results)
    _curves_plot(ctx, results)
    ctx.add_runs_note()


def table2(ctx: Context) -> None:
    results = ctx.results()
    _shift_section(ctx, results)
    path = plot_shift(ctx.report.plot_path("anisotropic"), results)
    ctx.report.add_plot(path, "Fig. 3: isotropic vs anisotropic test loss by depth")
    ctx.add_runs_note()


def table3(ctx: Context) -> None:
    results = ctx.results()
    _convergence_section(ctx, results)
    _curves_plot(ctx, results)
    ctx.add_runs_note()


def all_tables(ctx: Context) -> None:
    results = ctx.results()
    _isotropic_claims(ctx, results)
    _parameter_section(ctx)
    _loss_tables(ctx, results)
    _shift_section(ctx, results)
    _convergence_section(ctx, results)
    _curves_plot(ctx, results)
    path = plot_shift(ctx.report.plot_path("anisotropic"), results)
    ctx.report.add_plot(path, "Fig. 3: isotropic vs anisotropic test loss by depth")
    ctx.add_runs_note()


def _ablation_section(ctx: Context, ablation: dict[str, GroupResult]) -> None:
    """The appendix's feature-map ablation: one row per map, its final test loss beside the trivial predictor's."""
    rows, numbers = [], {}
    head_dim = ctx.scale.n_embd // N_HEAD
    for name, r in ablation.items():
        mean, half = r.interval("test")
        trivial = r.trivial("test")
        rows.append(
            (
                f"`{name}`",
                FEATURE_MAP_FORMULAS[name],
                feature_dim(name, head_dim),
                DOCUMENT_ABLATION[name],
                _pm(mean, half),
                ", ".join(f"{v:.4f}" for v in r.final("test").tolist()),
                f"{trivial:.4f}",
                f"{mean / trivial:.3f}",
                "yes" if r.subject().testable else "no",
                "no" if r.plateaued() else "yes",
            )
        )
        numbers[name] = {
            "group": r.spec.name,
            "test": {"per_seed": r.final("test").tolist(), "mean_ci95": (mean, half)},
            "trivial_test": trivial,
            "anisotropic": {"per_seed": r.final("anisotropic").tolist(), "mean_ci95": r.interval("anisotropic")},
            "samples_to_90": r.samples_to_90(),
            "plateaued": r.plateaued(),
        }
    ctx.report.numbers["ablation"] = numbers
    spec = next(iter(ablation.values())).spec
    ctx.report.add(
        f"Feature-map ablation (the appendix): the {ABLATION_DEPTH}-layer linear-attention model with each map, "
        f"trained the same way ({spec.steps:,} steps × {spec.batch_size}, lr {spec.learning_rate:g}, width "
        f"{spec.n_embd}, seeds {spec.seeds}); φ is applied to q/√d_head and k/√d_head (d_head {head_dim}, hence the "
        "feature width), normalised with ε = 1e-6 in the denominator. Test loss: mean over seeds ± the 95 % t "
        "interval of that mean; the trivial predictor (ŷ = 0) on the same prompts; learned: below 0.9 × trivial.\n\n"
        + _table(
            (
                "map",
                "φ(x)",
                "width",
                "document",
                "test loss (ours)",
                "per seed",
                "trivial",
                "ours / trivial",
                "learned",
                "still improving",
            ),
            rows,
        )
    )
    _ablation_claims(ctx, ablation)


def _ablation_claims(ctx: Context, ablation: dict[str, GroupResult]) -> None:
    """The appendix's sentences about the maps, and Sec. 2.2.2's "strictly dominating standard ReLU"."""
    loss = {name: r.interval("test") for name, r in ablation.items()}

    def about(*names: str, intervals: bool = False) -> tuple[Testability, list[Subject]]:
        return testability(ablation, names, intervals=intervals), subjects(ablation, names)

    identity = loss["identity"]
    _claim(
        ctx,
        f"the identity map φ(x) = x learns nothing: final test loss near the trivial predictor's, even at "
        f"{_layers(ABLATION_DEPTH)}",
        DOCUMENT_ABLATION["identity"],
        f"identity {_pm(*identity)}, trivial {ablation['identity'].trivial():.4f}",
        not ablation["identity"].subject().testable,
        *about("identity"),
    )
    better = ("relu", "quadratic")
    _claim(
        ctx,
        "ReLU and the quadratic map [1, x_i, x_i x_j (i ≤ j)] both reach a lower test loss than the identity map",
        "'We saw an improvement in MSE with both of these feature maps'",
        ", ".join(f"{name} {_pm(*loss[name])}" for name in better) + f" vs identity {_pm(*identity)}",
        all(loss[name][0] < identity[0] for name in better),
        *about("identity", *better),
    )
    rivals = ("relu", "quadratic")
    squared = loss["squared_relu"]
    _claim(
        ctx,
        "squared ReLU, ReLU and the quadratic map combined, has the best test loss (below ReLU's and the quadratic "
        "map's)",
        "'a squared relu feature map, which had the best MSE'",
        f"squared_relu {_pm(*squared)} vs " + ", ".join(f"{name} {_pm(*loss[name])}" for name in rivals),
        all(squared[0] < loss[name][0] for name in rivals),
        *about("squared_relu", *rivals),
    )
    _claim(
        ctx,
        "squared ReLU strictly dominates ReLU: a lower test loss beyond the seeds' uncertainty",
        "'strictly dominating standard ReLU baselines in our preliminary tests' (Sec. 2.2.2)",
        f"squared_relu {_pm(*squared)} vs relu {_pm(*loss['relu'])}",
        squared[0] < loss["relu"][0] and separated(squared, loss["relu"]),
        *about("squared_relu", "relu", intervals=True),
    )


def ablation(ctx: Context) -> None:
    results = ctx.ablation()
    _ablation_section(ctx, results)
    path = plot_ablation(ctx.report.plot_path("feature_maps"), results)
    ctx.report.add_plot(
        path, f"Feature-map ablation: test loss by map, {_layers(ABLATION_DEPTH)} (95 % band over seeds)"
    )
    ctx.add_runs_note(list(results.values()))


# -- engines: how to spend the cores ----------------------------------------------------------------------------
#: the ways ``engines`` times: (name, engine, processes, threads per process); None: one per core
WAYS = (
    ("package trainer, 1 process × 1 thread", "trainer", 1, 1),
    ("seed ensemble, 1 process × 1 thread", "ensemble", 1, 1),
    ("package trainer, 1 process × all threads", "trainer", 1, None),
    ("seed ensemble, 1 process × all threads", "ensemble", 1, None),
    ("package trainer, one process per core × 1 thread", "trainer", None, 1),
    ("seed ensemble, one process per core × 1 thread", "ensemble", None, 1),
)


def _trainer_steppers(spec: GroupSpec, output_dir: Path) -> list[Callable[[int], None]]:
    """One ``ICLTrainer`` per seed (its own model, optimizer and batches), stepped by its optimizer step."""
    from ..training import ICLTrainer, ICLTrainingArguments

    recipe, steppers = RECIPES[spec.recipe], []
    for seed in spec.seeds:
        overrides = {k: v for k, v in spec.model_fields().items() if k not in ("n_dims", "n_points", "target_kind")}
        args = ICLTrainingArguments(
            output_dir=str(output_dir / f"seed{seed}"),
            n_dims=N_DIMS,
            n_points=N_POINTS,
            model_type=recipe.model_type,
            model_size=None,
            model_overrides=json.dumps(overrides),
            per_device_train_batch_size=spec.batch_size,
            learning_rate=spec.learning_rate,
            max_grad_norm=float(N_DIMS),  # MSE clipped at d = the study's MSE/d clipped at 1
            seed=seed,
            report_to="none",
            disable_tqdm=True,
        )
        trainer, generator = ICLTrainer(args), torch.Generator()
        # the trainer's own step (the part train() repeats), without its evaluation and saving around it
        steppers.append(lambda step, t=trainer, g=generator: t._optimizer_step(step, g))
    return steppers


def _time_worker(engine: str, spec: dict, steps: int, warmup: int, threads: int, scratch: str) -> tuple:
    """Time ``steps`` steps of ``engine`` on the seeds of ``spec``; returns (start, end, seed-steps)."""
    torch.set_num_threads(threads)
    spec = GroupSpec.from_dict(spec)
    task = study_task()
    if engine == "trainer":
        steppers = _trainer_steppers(spec, Path(scratch))
    else:
        recipe = RECIPES[spec.recipe]
        ensemble = SeedEnsemble(
            recipe.model_type,
            spec.model_fields(),
            spec.seeds,
            spec.learning_rate,
            attn_implementation=recipe.attn_implementation,
        )
        steppers = [lambda step: ensemble.step(*draw_batches(task, None, spec.batch_size, spec.seeds, step))]
    for step in range(warmup):
        for stepper in steppers:
            stepper(step)
    start = time.time()
    for step in range(warmup, warmup + steps):
        for stepper in steppers:
            stepper(step)
    return start, time.time(), steps * len(spec.seeds)


def time_way(
    spec: GroupSpec, engine: str, processes: int, threads: int, *, steps: int, warmup: int, scratch: Path
) -> float:
    """Seed-steps per second of ``engine`` on ``spec``'s seeds split over ``processes`` fresh processes of
    ``threads`` threads each, all timed over one wall-clock window (from the first start to the last end)."""
    shares = [spec.seeds[i::processes] for i in range(processes)]
    with worker_pool(processes) as pool:
        jobs = [
            pool.submit(
                _time_worker,
                engine,
                replace(spec, seeds=share).to_dict(),
                steps,
                warmup,
                threads,
                str(scratch / str(i)),
            )
            for i, share in enumerate(shares)
        ]
        spans = [job.result() for job in jobs]
    wall = max(end for _, end, _ in spans) - min(start for start, _, _ in spans)
    return sum(n for _, _, n in spans) / wall


def engines(ctx: Context) -> None:
    """Seed-steps per second of each way in :data:`WAYS` to train the document's five seeds of a 3-layer group, at
    the CPU default's shapes (the scale's, for a custom scale)."""
    import tempfile

    cores, steps, warmup = usable_cores(), ctx.steps or 20, 3
    shapes = CPU if ctx.scale.full else ctx.scale  # a small setting even under --full
    seeds = tuple(s + ctx.seed for s in SEEDS)
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    rows, numbers = [], {"cores": cores, "load_average_before": load}
    for key, recipe in RECIPES.items():
        spec = next(s for s in group_specs(shapes, ctx.seed) if s.recipe == key and s.depth == 3)
        spec = replace(spec, seeds=seeds)
        rates = {}
        for name, engine, processes, threads in WAYS:
            n = processes or min(cores, len(seeds))
            with tempfile.TemporaryDirectory() as scratch:
                rates[name] = time_way(
                    spec, engine, n, threads or cores, steps=steps, warmup=warmup, scratch=Path(scratch)
                )
            log(f"engines: {recipe.label}, {name}: {rates[name]:.1f} seed-steps/s")
        base = rates[WAYS[0][0]]
        rows += [(recipe.label, name, f"{rate:.1f}", f"{rate / base:.2f}×") for name, rate in rates.items()]
        numbers[key] = rates
    ctx.report.numbers["seed_steps_per_second"] = numbers
    busy = "" if load is None else f" The 1-minute load average before the measurement was {load[0]:.2f}."
    ctx.report.add(
        f"Seed-steps per second (higher is faster) on {cores} cores: {len(seeds)} seeds of the 3-layer models at "
        f"width {shapes.n_embd}, batches of 32 (softmax) and 64 (linear), {steps} timed steps after {warmup} warm-up "
        "steps, each way in fresh processes; the seeds are split between the processes. The trainer runs its own "
        f"optimizer step (softmax attention through SDPA), the ensemble the stacked step (eager attention).{busy}\n\n"
        + _table(("model", "way", "seed-steps / s", "vs the first row"), rows)
    )


EXPERIMENTS = {
    "table1": Experiment("test (and train) loss by depth, softmax GPT-2 vs linear attention; parameters", table1),
    "table2": Experiment("the anisotropic input shift x ~ N(0, diag(0.5, 1, 1.5, 1, 1.75)) (Fig. 3)", table2),
    "table3": Experiment("convergence: samples seen to close 90 % of the test-loss gap", table3),
    "all": Experiment("Tables 1–3 and Figs. 1–3 from one set of runs", all_tables),
    "ablation": Experiment(
        "the appendix's feature-map ablation: identity, ReLU, quadratic [1, x_i, x_i x_j (i ≤ j)] and ReLU², "
        f"{_layers(ABLATION_DEPTH)}",
        ablation,
    ),
    "engines": Experiment("timing: ways to train the seeds on this machine's cores", engines),
}


def describe(scale: Scale, steps: int | None = None) -> str:
    """The size line of a report."""
    specs = group_specs(scale, 0, steps)
    by_recipe = {
        key: "/".join(str(s.steps) for s in specs if s.recipe == key) + f" steps × {RECIPES[key].batch_size}"
        for key in RECIPES
    }
    pool = f"a fixed training set of {scale.train_pool:,} prompts" if scale.train_pool else "fresh training prompts"
    return (
        f"{scale.label}: d_model {scale.n_embd}, {N_HEAD} heads, depths 1/3/6; {len(scale.seeds)} seeds "
        f"{scale.seeds}; softmax {by_recipe['softmax']}, linear {by_recipe['linear']} (depths 1/3/6); {pool}; "
        f"{scale.test_prompts:,} prompts per evaluation set; test loss every {specs[0].eval_steps} steps"
    )


def run(
    experiment: str,
    *,
    full: bool = False,
    output_dir: str | Path = "outputs/reproduce",
    seed: int = 0,
    retrain: bool = False,
    steps: int | None = None,
    mlp_steps: int | None = None,
    command: str = "",
    scale: Scale | None = None,
    workers: int | None = None,
) -> Path:
    """Run one experiment; returns the path of its ``results.md``.

    ``seed`` shifts the document's seeds (and the data seed) by that much; ``steps`` replaces every run's step
    count; ``workers`` is the number of training processes (default one per core; 1 trains in this process);
    ``scale`` replaces the CPU/full sizes altogether (tests). Finished runs with the same settings are reused
    unless ``retrain``. Worker processes are spawned, so a script that calls this with more than one worker must
    do so under ``if __name__ == "__main__":`` (the ``hf-icl`` command does).
    """
    if mlp_steps is not None:
        raise ValueError(f"--mlp-steps: the linear-attention study trains no MLPs, got mlp_steps={mlp_steps}")
    scale = scale or (FULL if full else CPU)
    root = Path(output_dir) / PAPER
    out = root / experiment
    size = describe(scale, steps)
    report = Report(PAPER, experiment, EXPERIMENTS[experiment].title, size, command, out)
    log(f"{PAPER} {experiment}: {report.title} — {size}")
    if not scale.full:
        log(
            f"CPU-sized run (width {scale.n_embd}, {len(scale.seeds)} seeds, 1/{scale.step_divisor} of the steps); "
            "--full runs the document's sizes"
        )
    context = Context(scale, out, root / "runs", report, seed=seed, retrain=retrain, steps=steps, workers=workers)
    EXPERIMENTS[experiment].run(context)
    return report.write()
