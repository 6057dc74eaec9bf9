from .configuration_mlp import MLPICLConfig, OneLayerFeatureMapConfig
from .configuration_sgpt import NORMALIZATIONS, SGPTConfig
from .feature_maps import FEATURE_MAPS, feature_map, prompt_matrix, psi_kernel, psi_linear
from .modeling_mlp import MLPForInContextRegression, OneLayerFeatureMapModel
from .modeling_sgpt import SGPTForInContextRegression, SGPTModel, SGPTPreTrainedModel, per_prefix_predictions
