"""Task families, input distributions and ``datasets`` builders.

The builders import ``datasets`` lazily, so ``import hf_icl.data`` stays light.
"""

from .inputs import (
    INPUT_REGISTRY,
    CovarianceGaussianInputs,
    DiagonalGaussianInputs,
    GaussianInputs,
    InputDistribution,
    UniformInputs,
    make_inputs,
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
