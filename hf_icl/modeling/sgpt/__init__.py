from .configuration_sgpt import NORMALIZATIONS, SGPTConfig
from .modeling_sgpt import SGPTForInContextRegression, SGPTModel, SGPTPreTrainedModel, per_prefix_predictions
