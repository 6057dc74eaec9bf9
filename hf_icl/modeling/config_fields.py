"""What the ICL configs share: a check that a field the config does not know is an error, not a default, and the
prompt fields (:class:`ICLPromptConfig`).

transformers (5.x) builds a ``PretrainedConfig`` as a dataclass and hands every keyword that is not
a dataclass field to ``__post_init__(self, **kwargs)``, which would store it as a plain attribute.
A typo (``n_layers=2`` for ``n_layer``, ``cab_sparsty``) therefore trained with the defaults, silently.
:func:`check_config_kwargs` lets through only what transformers itself passes or consumes there, the
``cab_*`` fields of CAB attention (validated like :func:`hf_icl.enable_cab` validates them) and the
config's ``attribute_map`` aliases; anything else raises a ``ValueError`` naming close matches.

Every config calls it first thing in ``__post_init__``::

    def __post_init__(self, **kwargs):
        kwargs = check_config_kwargs(self, kwargs)
        ...  # validate the fields
        super().__post_init__(**kwargs)
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from transformers import PretrainedConfig

from ..validation import check_choice, did_you_mean

#: keys that transformers' save_pretrained / from_pretrained / AutoConfig / from_dict pass to a config's
#: ``__post_init__`` (they are not dataclass fields), or that ``PretrainedConfig.__post_init__`` consumes
TRANSFORMERS_KWARGS = frozenset(
    {
        "model_type",  # written to config.json, passed back by from_pretrained
        "name_or_path",  # AutoConfig / AutoModel.from_pretrained
        "_name_or_path",  # to_dict() → from_dict / cls(**to_dict())
        "_commit_hash",  # Hub downloads (older 5.x releases set it on the config)
        "torch_dtype",  # configs saved before ``dtype`` replaced it
        "attn_implementation",
        "experts_implementation",
        "output_attentions",
        "num_labels",
        "per_layer_config",
        "_attn_implementation_internal",  # ignored by transformers when a saved config carries it
        "_experts_implementation_internal",
    }
)


def generation_parameters() -> frozenset[str]:
    """Generation settings that transformers accepts (and drops) in a model config."""
    try:
        from transformers import GenerationConfig

        return frozenset(GenerationConfig._get_default_generation_params())
    except (ImportError, AttributeError):  # pragma: no cover - a transformers without the private helper
        return frozenset(
            {"max_length", "min_length", "do_sample", "early_stopping", "num_beams", "temperature", "top_k", "top_p"}
        )


def cab_fields() -> dict[str, str]:
    """``{config field: CABParams keyword}`` for CAB's ``cab_*`` hyperparameters."""
    from ..attention.cab import CABParams, config_field

    return {config_field(name): name for name in CABParams.__dataclass_fields__}


def check_config_kwargs(config, kwargs: dict[str, Any]) -> dict[str, Any]:
    """Validate the extra keywords a config's ``__post_init__`` received; return those for transformers.

    * ``attribute_map`` aliases (``hidden_size`` for GPT-2's ``n_embd``, …) are applied to their field
      now, so the field checks that follow see them;
    * ``model_type`` must be the config's own (a config of another model is not silently read as this one);
    * ``cab_*`` fields are validated together through ``CABParams`` (set them with :func:`hf_icl.enable_cab`);
    * transformers' own keys (:data:`TRANSFORMERS_KWARGS`, generation parameters) pass through;
    * anything else raises ``ValueError``: ``GPT2ICLConfig got an unknown field 'n_layers'; did you mean 'n_layer'?``
    """
    cls = type(config)
    kwargs = dict(kwargs)
    aliases = getattr(cls, "attribute_map", {}) or {}
    for alias in [key for key in kwargs if key in aliases]:
        setattr(config, aliases[alias], kwargs.pop(alias))
    model_type = kwargs.get("model_type")
    if model_type is not None and cls.model_type and model_type != cls.model_type:
        raise ValueError(
            f"{cls.__name__} got model_type={model_type!r}; it reads configs of model_type {cls.model_type!r} only "
            f"(load a {model_type!r} checkpoint with its own config class, e.g. AutoConfig)"
        )
    cab = cab_fields()
    cab_values = {cab[key]: kwargs[key] for key in kwargs if key in cab}
    if cab_values:
        from ..attention.cab import CABParams

        CABParams(**cab_values)  # raises ValueError naming the cab_* field, the value and what is allowed
    allowed = TRANSFORMERS_KWARGS | generation_parameters()
    unknown = [key for key in kwargs if key not in cab and key not in allowed]
    if unknown:
        known = sorted({f.name for f in fields(cls)} | set(cab) | set(aliases))
        raise ValueError(_unknown_fields_message(cls.__name__, unknown, known))
    return kwargs


class ICLPromptConfig(PretrainedConfig):
    """The prompt fields of the ICL configs (GPT-2, linear-attention GPT, SGPT, the MLPs), with their defaults.

    A base class only (no ``model_type``): a config that derives from it has these dataclass fields first, before its
    own, and may declare one again with another default. :func:`check_prompt_fields` validates them.
    """

    n_dims: int = 20
    n_points: int = 41
    target_kind: str = "regression"
    n_classes: int = 2

    @property
    def label_width(self) -> int:
        """Width of an encoded label: 1, or ``n_classes`` one-hot entries."""
        return self.n_classes if self.target_kind == "categorical" else 1


def check_prompt_fields(config) -> None:
    """Validate the prompt fields every ICL config has: ``n_dims``, ``n_points``, ``target_kind``, ``n_classes``."""
    from ..validation import check_int
    from .prompts import TARGET_KINDS

    check_int("n_dims", config.n_dims, low=1)
    check_int("n_points", config.n_points, low=1)
    check_choice("target_kind", config.target_kind, TARGET_KINDS)
    check_int("n_classes", config.n_classes, low=2)


def preset_width(size: str, presets: dict[str, int], field: str, kwargs: dict[str, Any]) -> int:
    """The width ``presets[size]`` that ``from_preset(size, **kwargs)`` sets as ``field``; ``ValueError`` for an
    unknown size or a ``field`` also passed in ``kwargs``."""
    check_choice("size", size, sorted(presets))
    if field in kwargs:
        raise ValueError(f"size={size!r} sets {field}={presets[size]}; do not also pass {field}={kwargs[field]!r}")
    return presets[size]


def _unknown_fields_message(owner: str, unknown: list[str], known: list[str]) -> str:
    parts = []
    for key in unknown:
        hint = f"; {close}" if (close := did_you_mean(key, known, n=3)) else ""
        parts.append(f"{owner} got an unknown field {key!r}{hint}")
    tail = "" if all("did you mean" in part for part in parts) else f" (its fields: {', '.join(known)})"
    return "; ".join(parts) + tail
