"""Nadaraya–Watson kernel smoothing over the earlier examples of every position (or over a context)."""

from __future__ import annotations

import torch

from ..similarity.row_kernels import WEDGE_MODES, row_kernel_scores
from ..validation import check_choice, check_float
from ._bandwidth import check_bandwidth
from ._prefix import earlier_mask, to_working
from .base import InContextEstimator

NW_KERNELS = ("exp", "softmax", "rbf", "hilbert", "cosine", "cayley", "ga")
#: the angular kernels of the kernel-regression document, on the unit rows ``x / |x|``, and their default
#: temperature T (the document's values: 0.1 for cosine and Cayley, 1.0 for GA)
ANGULAR_TEMPERATURES = {"cosine": 0.1, "cayley": 0.1, "ga": 1.0}
#: the GA kernel's extra arguments and their defaults (the document's ``ga_icl``)
GA_DEFAULTS = {"beta1": 4.0, "beta2": 1.0, "wedge_mode": "penalty", "wedge_mu": 0.5}


class NadarayaWatson(InContextEstimator):
    """Kernel-weighted average ``ŷ_i = Σ_{j<i} w_ij y_j / Σ_{j<i} w_ij``.

    Kernels (``d`` is the input dimension, ``xs.shape[-1]``; ``θ_ij`` the angle between ``x_i`` and ``x_j``):

    * ``"exp"`` / ``"softmax"`` (synonyms): ``w_ij = exp(x_iᵀx_j / bandwidth)``, a softmax
      attention over the examples with temperature ``bandwidth`` (bandwidth 1 is the document's
      "raw attention ICL");
    * ``"rbf"``: ``w_ij = exp(-|x_i - x_j|² / (2 bandwidth²))``;
    * ``"hilbert"``: ``w_ij = |x_i - x_j|^-d``, the Hilbert kernel estimate (no bandwidth; a
      consistent smoother). If ``x_i`` exactly equals earlier points, its weight concentrates on
      them (the limit of the kernel): the prediction is the mean of their ``y``;
    * ``"cosine"``: ``w_ij = exp(cos θ_ij / T)``;
    * ``"cayley"``: ``w_ij = exp(-θ_ij² / (2T²))``, a Gaussian kernel in the angle;
    * ``"ga"``: ``w_ij = exp((β₁ cos θ_ij - β₂ sin θ_ij) / T)`` (``wedge_mode="penalty"``) or
      ``exp((β₁ cos θ_ij - β₂ (sin θ_ij - μ)²) / T)`` (``wedge_mode="well"``).

    For the three angular kernels ``bandwidth`` is the temperature ``T``; its default is the document's value,
    0.1 for cosine and Cayley and 1.0 for GA. Their scores come from :mod:`hf_icl.similarity.row_kernels`, which
    clamps ``cos θ`` away from ±1 and maps a zero row to the zero vector, so parallel, antiparallel and zero
    inputs give finite predictions and gradients. In one dimension ``x / |x|`` is only a sign: embed the
    inputs first (:class:`~hf_icl.estimators.RandomFourierFeatures` with :class:`~hf_icl.estimators.OnFeatures`),
    as the document does.

    Weights are normalised in log space with a masked log-sum-exp, so large logits are stable.
    Position 0 (no examples) predicts 0.

    Args:
        kernel: one of ``"exp"``, ``"softmax"``, ``"rbf"``, ``"hilbert"``, ``"cosine"``, ``"cayley"``, ``"ga"``.
        bandwidth: temperature (exp/softmax and the angular kernels) or length scale (rbf), > 0; default 1,
            or the angular kernel's default above. The Hilbert kernel has none, so passing one with it is an
            error rather than silently ignored.
        beta1: GA only: weight β₁ of the inner (cos θ) part, default 4.
        beta2: GA only: weight β₂ of the wedge (sin θ) part, default 1.
        wedge_mode: GA only: ``"penalty"`` (default) or ``"well"``.
        wedge_mu: GA with ``wedge_mode="well"`` only: the well's position μ, default 0.5.

    The GA arguments given with another kernel, or ``wedge_mu`` with the penalty mode, are errors (they
    would be silently ignored).

    >>> import torch
    >>> from hf_icl.estimators import NadarayaWatson
    >>> nw = NadarayaWatson("ga", wedge_mode="well")
    >>> nw.name
    'nadaraya_watson(ga, T=1, β1=4, β2=1, well μ=0.5)'
    >>> xs = torch.randn(2, 6, 4)
    >>> nw(xs, xs.sum(-1)).shape
    torch.Size([2, 6])
    """

    def __init__(
        self,
        kernel: str = "rbf",
        bandwidth: float | None = None,
        *,
        beta1: float | None = None,
        beta2: float | None = None,
        wedge_mode: str | None = None,
        wedge_mu: float | None = None,
    ):
        self.kernel = check_choice("kernel", kernel, NW_KERNELS)
        if bandwidth is None:
            bandwidth = ANGULAR_TEMPERATURES.get(kernel)
        self.bandwidth = check_bandwidth(bandwidth, kernel, uses_bandwidth=kernel != "hilbert")
        self.ga_params = self._ga_params(beta1=beta1, beta2=beta2, wedge_mode=wedge_mode, wedge_mu=wedge_mu)
        self.name = f"nadaraya_watson({kernel}{self._describe_params()})"

    def _ga_params(self, **given) -> dict:
        """The GA kernel's keyword arguments for :func:`ga_scores` (empty for other kernels), validated."""
        passed = [name for name, value in given.items() if value is not None]
        if self.kernel != "ga":
            if passed:
                raise ValueError(
                    f"{passed[0]} applies only to kernel='ga', got {passed[0]}={given[passed[0]]!r} "
                    f"with kernel={self.kernel!r}"
                )
            return {}
        params = {name: GA_DEFAULTS[name] if value is None else value for name, value in given.items()}
        check_choice("wedge_mode", params["wedge_mode"], WEDGE_MODES)
        if params["wedge_mode"] == "penalty":
            if given["wedge_mu"] is not None:
                raise ValueError(
                    f"wedge_mu applies only to wedge_mode='well', got wedge_mu={given['wedge_mu']!r} "
                    "with wedge_mode='penalty'"
                )
            del params["wedge_mu"]  # the penalty mode has no μ
        for name in ("beta1", "beta2", "wedge_mu"):
            if name in params:
                params[name] = check_float(name, params[name])
        return params

    def _describe_params(self) -> str:
        if self.kernel == "hilbert":
            return ""
        if self.kernel in ("exp", "softmax"):
            return f", τ={self.bandwidth:g}"
        if self.kernel == "rbf":
            return f", h={self.bandwidth:g}"
        if self.kernel != "ga":
            return f", T={self.bandwidth:g}"
        ga = self.ga_params
        well = f" μ={ga['wedge_mu']:g}" if ga["wedge_mode"] == "well" else ""
        return f", T={self.bandwidth:g}, β1={ga['beta1']:g}, β2={ga['beta2']:g}, {ga['wedge_mode']}{well}"

    def _predict(self, xs: torch.Tensor, ys: torch.Tensor) -> torch.Tensor:
        xs, ys = to_working(xs, ys)
        usable = earlier_mask(xs.shape[1], xs.device)
        # Position 0 has no usable pair and predicts exactly 0; leaving its row out of the normalisation
        # avoids a log-sum-exp over an all -inf row (NaN intermediates that would have to be masked away).
        later = self._weighted_average(xs[:, 1:], xs, ys, usable[1:])
        return torch.cat([torch.zeros_like(ys[:, :1]), later], dim=1)

    def _predict_queries(
        self, context_xs: torch.Tensor, context_ys: torch.Tensor, query_xs: torch.Tensor
    ) -> torch.Tensor:
        context_xs, context_ys, query_xs = to_working(context_xs, context_ys, query_xs)
        usable = torch.ones(query_xs.shape[1], context_xs.shape[1], dtype=torch.bool, device=context_xs.device)
        return self._weighted_average(query_xs, context_xs, context_ys, usable)

    def _weighted_average(
        self, queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, usable: torch.Tensor
    ) -> torch.Tensor:
        """``Σ_j w_qj values_j / Σ_j w_qj`` over the usable keys of each query (every query has at least one)."""
        log_weights = self._log_weights(queries, keys, usable).masked_fill(~usable, float("-inf"))
        weights = torch.exp(log_weights - torch.logsumexp(log_weights, dim=-1, keepdim=True))
        return (weights * values.unsqueeze(-2)).sum(-1)

    def _log_weights(self, queries: torch.Tensor, keys: torch.Tensor, usable: torch.Tensor) -> torch.Tensor:
        """Unnormalised log-weights ``(B, M, N)`` of ``queries (B, M, d)`` on ``keys (B, N, d)``; only the
        ``usable`` entries matter."""
        if self.kernel in ("exp", "softmax"):
            return row_kernel_scores(queries, keys, "softmax", scale=1 / self.bandwidth)
        if self.kernel == "rbf":
            return row_kernel_scores(queries, keys, "rbf", bandwidth=self.bandwidth)
        if self.kernel in ANGULAR_TEMPERATURES:
            return row_kernel_scores(queries, keys, self.kernel, temperature=self.bandwidth, **self.ga_params)
        distances = torch.cdist(queries, keys, compute_mode="donot_use_mm_for_euclid_dist")
        duplicates = (distances == 0) & usable
        has_duplicate = duplicates.any(-1, keepdim=True)
        log_hilbert = -queries.shape[-1] * torch.where(duplicates, 1.0, distances).log()
        # An exact duplicate has infinite weight: keep only the duplicates, with equal weights.
        on_duplicates = torch.where(duplicates, 0.0, float("-inf"))
        return torch.where(has_duplicate, on_duplicates, log_hilbert)
