"""Task families, input distributions, story corpora and ``datasets`` builders.

The builders import ``datasets`` lazily, so ``import hf_icl.data`` stays light.
"""

from .episodes import Episodes, digit_features, sample_episodes
from .inputs import (
    INPUT_REGISTRY,
    CovarianceGaussianInputs,
    DiagonalGaussianInputs,
    GaussianInputs,
    InputDistribution,
    UniformInputs,
    make_inputs,
)
from .stories import (  # the stories package imports datasets / tokenizers only where they are needed
    generate_template_stories,
    load_story_corpus,
    pack_stories,
    train_story_tokenizer,
)
from .tasks import (
    TASK_REGISTRY,
    Categorical,
    DecisionTree,
    LatentGroupSinusoid,
    LinearClassification,
    LinearRegression,
    NoisyLinearRegression,
    QuadraticRegression,
    Relu2NNRegression,
    Sinusoid,
    SparseLinearRegression,
    TaskFamily,
    available_tasks,
    get_task,
    iterate_prompts,
    make_task,
)


def __getattr__(name: str):
    # distinct_n and repetition_rate moved to hf_icl.evaluation.repetition; the stories package warns and serves them
    if name in ("distinct_n", "repetition_rate"):
        from . import stories

        return getattr(stories, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
