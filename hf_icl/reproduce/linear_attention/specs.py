"""What the linear-attention study trains: the document's two recipes, the sizes of a reproduction (:class:`Scale`),
one architecture at one depth with every seed (:class:`GroupSpec`: the unit of training and of the run cache) and the
config fields of its models."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from ...kernels.linear_attention import FEATURE_MAPS
from ...validation import check_choice
from .document import (
    ABLATION_DEPTH,
    ABLATION_MAPS,
    DATA_SEED,
    DEFAULT_FEATURE_MAP,
    DEPTHS,
    DOCUMENT_WIDTH,
    N_DIMS,
    N_HEAD,
    N_POINTS,
    SEEDS,
)


def depth_label(depth: int) -> str:
    """A depth as the document names it: "1 layer", "6 layers"."""
    return f"{depth} layer{'s' if depth > 1 else ''}"


# -- recipes and sizes ----------------------------------------------------------------------------------------------
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

    def model_config(self, n_embd: int, depth: int) -> dict:
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

    def group_model_config(self) -> dict:
        fields = RECIPES[self.recipe].model_config(self.n_embd, self.depth)
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
