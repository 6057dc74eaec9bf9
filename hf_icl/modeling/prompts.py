"""Prompt layouts and prompt checks shared by every ICL model.

Prompts follow the package protocol: ``xs (B, N, d)`` and ``ys (B, N)``; the prediction at
position ``i`` may use the pairs ``j < i`` and ``x_i`` only. Both prompt formats below lay a
prompt out as a causal token sequence in which the token that predicts ``y_i`` comes before
any token holding ``y_i``, so one causal forward pass predicts every position.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..validation import did_you_mean

#: What a model's targets are: real values (MSE), ±1 labels (BCE on one logit) or class ids (CE).
TARGET_KINDS = ("regression", "binary", "categorical")


def check_prompt(
    xs: torch.Tensor,
    ys: torch.Tensor,
    n_dims: int,
    max_points: int | None = None,
    *,
    target_kind: str = "regression",
    n_classes: int | None = None,
    check_values: bool = True,
    device: torch.device | None = None,
    dtype: torch.dtype | None = None,
    degree: int = 2,
) -> None:
    """Raise a clear ``ValueError`` unless ``xs (B, N, n_dims)`` and ``ys (B, N)`` form a valid prompt batch.

    Always checked (free: no device sync): both are tensors on one device, ``xs`` has a floating-point
    dtype and shape ``(B, N, n_dims)`` with ``B, N >= 1`` (and ``N <= max_points``), ``ys`` has shape
    ``(B, N)`` and a real dtype (bool and complex are refused), and they are on ``device`` (the model's) if given.

    With ``check_values`` (one fused reduction and ONE device sync) the values too: ``xs`` finite, and ``ys``
    finite real targets (``"regression"``), exactly ±1 (``"binary"``), or class ids, i.e. integers (an integer
    dtype, or floats with integral values) in ``[0, n_classes)`` (``"categorical"``). One NaN would otherwise
    turn every prediction of its prompt into NaN, a label 0 would become a BCE target of 0.5 and a class id
    1.7 would be truncated to 1, all silently. Callers that build prompts themselves (a trainer sampling
    tasks) pass ``check_values=False`` to skip the sync.

    The same reduction bounds the magnitudes: ``|xs|`` and, for regression, ``|ys|`` at most
    :func:`max_prompt_magnitude` ``(dtype, degree)``, ``dtype`` being the model's parameter dtype (the precision the
    forward runs in; ``xs.dtype`` when not given: a float16 model reading float32 prompts uses float16's bound).
    Finite but larger values overflow the forward's squared terms (LayerNorm variances, attention scores, norms,
    quadratic feature maps) and turn *every* prediction of the prompt into NaN, earlier positions included. The
    bounds come from a measurement (one x and one y entry of a power of ten, every model family in its tiny preset
    and variants, random weights and the same ×10, on the CPU), lowered by a margin:

    ========  ==========  ==========  ===============================================================
    dtype     degree 2    degree 3    largest finite power of ten measured (default weights / ×10)
    ========  ==========  ==========  ===============================================================
    float16   1e3         1e1         degree 2: 1e4 / 1e2 (√65504 = 256 leaves one order); degree 3: 1e1
    bfloat16  1e16        1e10        as float32 (the same exponent range)
    float32   1e16        1e10        degree 2: 1e18 / 1e16 (√3.4e38 = 1.8e19); degree 3: 1e12 / 1e12
    float64   1e150       1e100       degree 2: 1e153 / 1e151; degree 3: 1e102 / 1e102
    ========  ==========  ==========  ===============================================================

    ``degree=2`` is every model's; ``degree=3`` the MLPs' whose input goes through the one-step-GD feature map
    ``ψ_L(A) = (A Aᵀ) A`` (cubic in the prompt) and, in float16 only, the kernel ICL model with column attention
    (its column Gram matrix is computed in float16: limit 1e2). Class ids and ±1 labels are exact values, not
    magnitudes: they are not bounded. The bound is a necessary filter, not a guarantee: many entries near it,
    larger weights (float16 with ×10 weights: 1e2) or exponential terms (the GD transformer's unnormalised
    softmax kernel, ``exp`` of a score) can still overflow; a model whose forward can checks its output too
    (:class:`~hf_icl.modeling.gd_transformer.GDTransformerForInContextClassification`).
    """
    for name, value in (("xs", xs), ("ys", ys)):
        if not isinstance(value, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if not xs.is_floating_point():
        raise ValueError(f"xs must have a floating-point dtype (float32, bfloat16, float16, float64), got {xs.dtype}")
    if ys.dtype == torch.bool or ys.is_complex():
        allowed = "integer class ids" if target_kind == "categorical" else "real numbers (a floating-point dtype)"
        raise ValueError(f"ys must hold {allowed} for target_kind={target_kind!r}, got dtype {ys.dtype}")
    if xs.ndim != 3 or xs.shape[-1] != n_dims:
        raise ValueError(f"xs must have shape (batch, n_points, {n_dims}), got {tuple(xs.shape)}")
    if xs.shape[0] < 1 or xs.shape[1] < 1:
        raise ValueError(
            f"xs must hold at least one prompt of at least one point (batch >= 1, n_points >= 1), got shape "
            f"{tuple(xs.shape)}"
        )
    if ys.shape != xs.shape[:2]:
        raise ValueError(f"ys must have shape {tuple(xs.shape[:2])} to match xs, got {tuple(ys.shape)}")
    if ys.device != xs.device:
        raise ValueError(f"xs and ys must be on the same device, got xs on {xs.device} and ys on {ys.device}")
    if device is not None and xs.device != device:
        raise ValueError(f"xs and ys must be on the model's device {device}, got {xs.device}; move them with .to()")
    if max_points is not None and xs.shape[1] > max_points:
        raise ValueError(f"prompts have {xs.shape[1]} points but the model supports at most n_points={max_points}")
    if target_kind == "categorical" and n_classes is None:
        raise ValueError("check_prompt needs n_classes for target_kind='categorical'")
    if check_values:
        bound = max_prompt_magnitude(xs.dtype if dtype is None else dtype, degree)
        _check_prompt_values(xs, ys, target_kind, n_classes, bound, xs.dtype if dtype is None else dtype)


def check_model_prompt(
    config,
    xs: torch.Tensor,
    ys: torch.Tensor,
    *,
    check_values: bool = True,
    device=None,
    dtype: torch.dtype | None = None,
    degree: int = 2,
) -> None:
    """:func:`check_prompt` against an ICL config: its ``n_dims``, ``n_points``, ``target_kind`` and ``n_classes``;
    ``dtype`` is the model's parameter dtype (it picks the magnitude bound, :func:`max_prompt_magnitude`)."""
    check_prompt(
        xs,
        ys,
        config.n_dims,
        config.n_points,
        target_kind=config.target_kind,
        n_classes=config.n_classes,
        check_values=check_values,
        device=device,
        dtype=dtype,
        degree=degree,
    )


#: ``{degree: {dtype: bound}}``: the largest ``|x|``, ``|y|`` a prompt may hold, by the dtype of the model reading it
#: and the degree of the forward's polynomial terms (measured; the table and the method are in :func:`check_prompt`)
PROMPT_MAGNITUDE_BOUNDS = {
    2: {torch.float16: 1e3, torch.bfloat16: 1e16, torch.float32: 1e16, torch.float64: 1e150},
    3: {torch.float16: 1e1, torch.bfloat16: 1e10, torch.float32: 1e10, torch.float64: 1e100},
}


def max_prompt_magnitude(dtype: torch.dtype, degree: int = 2) -> float:
    """The largest ``|x|`` (and regression ``|y|``) a model whose parameters are ``dtype`` accepts in a prompt.

    ``degree`` 2 covers every model (squared terms: LayerNorm variances, attention scores, norms, quadratic feature
    maps); 3 the MLPs on the cubic one-step-GD feature map ``ψ_L`` and float16 column attention. The table and how
    it was measured: :func:`check_prompt`.

    >>> import torch
    >>> max_prompt_magnitude(torch.float32), max_prompt_magnitude(torch.float16), max_prompt_magnitude(torch.float64, 3)
    (1e+16, 1000.0, 1e+100)
    """
    if degree not in PROMPT_MAGNITUDE_BOUNDS:
        raise ValueError(f"degree must be one of {sorted(PROMPT_MAGNITUDE_BOUNDS)}, got {degree!r}")
    bounds = PROMPT_MAGNITUDE_BOUNDS[degree]
    if dtype not in bounds:
        names = ", ".join(str(d).removeprefix("torch.") for d in bounds)
        raise ValueError(f"dtype must be a floating-point dtype the models run in ({names}), got {dtype!r}")
    return bounds[dtype]


def _valid_targets(ys: torch.Tensor, target_kind: str, n_classes: int | None) -> torch.Tensor:
    """Bool mask of the entries of ``ys`` that are valid targets of ``target_kind``."""
    if target_kind == "binary":
        return (ys == 1) | (ys == -1)
    if target_kind == "categorical":
        ok = (ys >= 0) & (ys < n_classes)  # NaN and ±inf fail these comparisons
        return ok & (ys == ys.trunc()) if ys.is_floating_point() else ok
    if target_kind == "regression":
        return torch.isfinite(ys)
    raise ValueError(f"target_kind must be one of {list(TARGET_KINDS)}, got {target_kind!r}")


def _check_prompt_values(
    xs: torch.Tensor, ys: torch.Tensor, target_kind: str, n_classes: int | None, bound: float, dtype: torch.dtype
) -> None:
    finite_xs = torch.isfinite(xs)
    valid_xs = finite_xs & (xs.abs() <= bound)
    valid_ys = _valid_targets(ys, target_kind, n_classes)
    if target_kind == "regression":
        valid_ys = valid_ys & (ys.abs() <= bound)
    xs_ok, ys_ok = torch.stack((valid_xs.all(), valid_ys.all())).tolist()  # the one device sync
    limit = f"{bound:.6g} (the bound for a {str(dtype).removeprefix('torch.')} model, see max_prompt_magnitude)"
    if not xs_ok:
        index = tuple((~valid_xs).nonzero()[0].tolist())
        where = f"at xs[{', '.join(map(str, index))}] (prompt {index[0]}, position {index[1]})"
        if not finite_xs[index]:
            raise ValueError(f"xs must hold finite values only, got {_show(xs[index].item())} {where}")
        raise ValueError(f"xs must hold values of magnitude at most {limit}, got {_show(xs[index].item())} {where}")
    if not ys_ok:
        index = tuple((~valid_ys).nonzero()[0].tolist())
        value = _show(ys[index].item())
        where = f"at ys[{index[0]}, {index[1]}]"
        if target_kind == "binary":
            hint = " (labels in {0, 1} map to ±1 as 2 * ys - 1)" if ys[index].item() == 0 else ""
            raise ValueError(f"ys must be ±1 labels (-1 or 1) for target_kind='binary', got {value} {where}{hint}")
        if target_kind == "categorical":
            raise ValueError(
                f"ys must be integer class ids in [0, n_classes={n_classes}) for target_kind='categorical', "
                f"got {value} {where}"
            )
        if torch.isfinite(ys[index]):
            raise ValueError(
                f"ys must hold values of magnitude at most {limit}, got {value} {where} "
                f"(prompt {index[0]}, position {index[1]})"
            )
        raise ValueError(f"ys must hold finite values only for target_kind='regression', got {value} {where}")


def _show(value) -> str:
    """A tensor entry for a message: 1.7, not 1.7000000476837158."""
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def check_forward_kwargs(owner: str, kwargs: dict, own: tuple[str, ...] = ()) -> None:
    """Raise ``ValueError`` for a keyword a model's ``forward`` would otherwise pass on and the backbone ignore.

    Allowed: transformers' per-call keywords (``TransformersKwargs``: ``position_ids``, ``output_attentions``, …)
    and ``return_dict``. ``own`` lists the forward's own parameters, offered as close matches for a typo such
    as ``loss_position``.
    """
    from transformers.utils import TransformersKwargs

    allowed = set(getattr(TransformersKwargs, "__annotations__", {})) | {"return_dict"}
    unknown = [key for key in kwargs if key not in allowed]
    if unknown:
        candidates = sorted(allowed | set(own))
        parts = []
        for key in unknown:
            close = did_you_mean(key, candidates)
            parts.append(f"{key!r}" + (f" ({close})" if close else ""))
        raise ValueError(
            f"{owner}.forward got unexpected keyword argument(s) {', '.join(parts)}; it takes "
            f"{', '.join(own)} and transformers' per-call keywords ({', '.join(sorted(allowed))})"
        )


#: per-call keywords that change nothing for a model without a transformers backbone (a trainer may pass them)
HARMLESS_KWARGS = ("return_dict", "num_items_in_batch")


def check_no_backbone_kwargs(owner: str, kwargs: dict, own: tuple[str, ...] = ()) -> None:
    """:func:`check_forward_kwargs` for models that pass nothing on to a transformers backbone (SGPT, the MLPs):
    a per-call keyword they would silently ignore (``output_attentions=True``, ``position_ids=...``) is a
    ``ValueError`` too; :data:`HARMLESS_KWARGS` and keywords set to ``None`` or ``False`` pass."""
    check_forward_kwargs(owner, kwargs, own)
    ignored = sorted(k for k, v in kwargs.items() if k not in HARMLESS_KWARGS and v is not None and v is not False)
    if ignored:
        raise ValueError(
            f"{owner}.forward got unexpected keyword argument(s) it would ignore: "
            + ", ".join(f"{key}={kwargs[key]!r}" for key in ignored)
            + " (it passes nothing on to a transformers backbone)"
        )


def encode_labels(ys: torch.Tensor, target_kind: str, n_classes: int) -> torch.Tensor:
    """Targets as token features: ``(B, N, 1)`` values, or ``(B, N, C)`` one-hot class ids."""
    if target_kind == "categorical":
        return F.one_hot(ys.long(), n_classes).to(torch.get_default_dtype())
    # float64 labels stay float64 (a float64 model must not see them rounded to float32)
    return ys.unsqueeze(-1) if ys.is_floating_point() else ys.unsqueeze(-1).float()


class InterleavedPrompt:
    """Garg et al.'s layout: x_1, y_1, x_2, y_2, … with y tokens zero-padded to the token width.

    Token ``2i`` holds ``x_i`` and predicts ``y_i``; token ``2i+1`` holds ``y_i``.
    """

    def __init__(self, n_dims: int, label_width: int):
        self.n_dims = n_dims
        self.label_width = label_width
        self.token_width = max(n_dims, label_width)

    def tokens(self, xs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        batch, n_points, _ = xs.shape
        x_tokens = F.pad(xs, (0, self.token_width - self.n_dims))
        y_tokens = F.pad(labels.to(xs.dtype), (0, self.token_width - labels.shape[-1]))
        return torch.stack((x_tokens, y_tokens), dim=2).reshape(batch, 2 * n_points, self.token_width)

    @staticmethod
    def query_positions(n_points: int) -> slice:
        return slice(0, 2 * n_points, 2)


class ConcatenatedPrompt:
    """Tokens ``[x_i, y_i]``, each preceded by its query token ``[x_i, 0]``.

    The sequence is q_1, c_1, q_2, c_2, … with q_i = [x_i, 0] and c_i = [x_i, y_i]; q_i predicts
    y_i. Under a causal mask q_i already cannot see c_i; :meth:`context_mask` additionally hides
    the other queries, for models whose attention must only mix labelled examples.
    """

    def __init__(self, n_dims: int, label_width: int):
        self.n_dims = n_dims
        self.label_width = label_width
        self.token_width = n_dims + label_width

    def tokens(self, xs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        batch, n_points, _ = xs.shape
        context = torch.cat((xs, labels.to(xs.dtype)), dim=-1)
        query = F.pad(xs, (0, self.label_width))
        return torch.stack((query, context), dim=2).reshape(batch, 2 * n_points, self.token_width)

    @staticmethod
    def query_positions(n_points: int) -> slice:
        return slice(0, 2 * n_points, 2)

    @staticmethod
    def context_mask(n_points: int, device=None) -> torch.Tensor:
        """``(2N, 2N)`` bool, True where attention is allowed: every token sees earlier context
        tokens and itself, never another query token."""
        length = 2 * n_points
        idx = torch.arange(length, device=device)
        causal = idx[:, None] >= idx[None, :]
        is_context_key = (idx % 2 == 1)[None, :]
        return causal & (is_context_key | (idx[:, None] == idx[None, :]))


PROMPT_FORMATS = {"interleaved": InterleavedPrompt, "concatenated": ConcatenatedPrompt}


def prompt_layout(config) -> InterleavedPrompt | ConcatenatedPrompt:
    """The layout of an ICL config's prompts: its ``prompt_format``, for its ``n_dims`` and ``label_width``."""
    return PROMPT_FORMATS[config.prompt_format](config.n_dims, config.label_width)


def prompt_tokens(config, prompt, xs, ys, weight: torch.Tensor, check_values: bool = True) -> torch.Tensor:
    """The tokens ``(B, 2N, token_width)`` of the prompts ``xs``, ``ys`` laid out by ``prompt`` (:func:`prompt_layout`),
    in the dtype of the model's read-in ``weight``, after :func:`check_model_prompt` against its device and dtype."""
    check_model_prompt(config, xs, ys, check_values=check_values, device=weight.device, dtype=weight.dtype)
    labels = encode_labels(ys, config.target_kind, config.n_classes)
    return prompt.tokens(xs.to(weight.dtype), labels)
