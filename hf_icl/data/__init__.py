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
from .stories import (  # stories.py imports datasets / tokenizers only inside the functions that need them
    distinct_n,
    generate_template_stories,
    load_story_corpus,
    pack_stories,
    repetition_rate,
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
