"""Task families, input distributions, story corpora and ``datasets`` builders.

The builders import ``datasets`` lazily, so ``import hf_icl.data`` stays light.
"""

from ..deprecation import moved
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

#: the repetition metrics this package exported, now in :mod:`hf_icl.evaluation.repetition` (deprecated aliases,
#: for one release; data sits below evaluation, so they are imported only when asked for)
__getattr__ = moved(__name__, dict.fromkeys(("distinct_n", "repetition_rate"), "hf_icl.evaluation.repetition"))
