"""Fixed input feature maps, and running an estimator on mapped inputs.

The kernel-regression document embeds its scalar inputs with random Fourier features before the angular
kernels (cosine, Cayley, GA) see them: on one-dimensional inputs ``x / |x|`` is only a sign.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..validation import check_float, check_int
from .base import InContextEstimator


class RandomFourierFeatures:
    """``φ(x) = [cos(x W), sin(x W)]`` with fixed random frequencies ``W = scale · N(0, 1)^(n_dims × n_frequencies)``.

    ``W`` is drawn once, in float64 on the CPU, from ``torch.Generator().manual_seed(seed)``, so a seed fixes
    it on every machine; the defaults reproduce the document's ``torch.manual_seed(42);
    torch.randn(1, 32, dtype=torch.float64) * 2.0``. The inner products ``φ(x)ᵀφ(x')`` estimate the Gaussian
    kernel ``exp(-scale² |x - x'|² / 2)`` (times ``n_frequencies``).

    Args:
        n_dims: input dimension ``d`` >= 1.
        n_frequencies: number of frequencies >= 1; the features have ``2 * n_frequencies`` entries.
        scale: standard deviation of the frequencies, > 0.
        seed: seed of the generator that draws ``W``, in ``[0, 2**64 - 1]`` (what ``manual_seed`` takes).

    Calling it maps ``xs (..., n_dims)`` to ``(..., 2 * n_frequencies)`` in ``xs``'s dtype and device. The inputs
    must be finite, and their phases ``x·w`` resolvable: a ``ValueError`` names the first input whose bound
    ``Σ_k |x_k| |w_k|`` on the phase exceeds :func:`max_rff_phase` of ``xs``'s dtype (``1 / eps``: 8.4e6 in
    float32, 4.5e15 in float64). Past it neighbouring representable phases are a radian or more apart, so
    ``cos`` and ``sin`` of the rounded phase are noise (still finite: an input of 1e20 would give finite,
    meaningless features), and past ``finfo.max`` the product overflows to ``inf`` and the features are NaN.
    Refusing is the only honest answer; nothing is clipped. The check is one device sync per call.

    >>> import torch
    >>> rff = RandomFourierFeatures()
    >>> rff.name, rff.frequencies.shape
    ('rff(32, scale=2)', torch.Size([1, 32]))
    >>> rff(torch.zeros(5, 1))[0, :3], rff(torch.zeros(5, 1))[0, 32:35]
    (tensor([1., 1., 1.]), tensor([0., 0., 0.]))
    """

    def __init__(self, n_dims: int = 1, n_frequencies: int = 32, scale: float = 2.0, seed: int = 42):
        self.n_dims = check_int("n_dims", n_dims, low=1)
        self.n_frequencies = check_int("n_frequencies", n_frequencies, low=1)
        self.scale = check_float("scale", scale, low=0.0, low_inclusive=False)
        self.seed = check_int("seed", seed, low=0, high=2**64 - 1)
        generator = torch.Generator().manual_seed(seed)
        normal = torch.randn(n_dims, n_frequencies, generator=generator, dtype=torch.float64)
        self.frequencies = normal * self.scale
        self.name = f"rff({n_frequencies}, scale={self.scale:g})"

    def __call__(self, xs: torch.Tensor) -> torch.Tensor:
        if not isinstance(xs, torch.Tensor) or not xs.is_floating_point():
            got = xs.dtype if isinstance(xs, torch.Tensor) else type(xs).__name__
            raise ValueError(f"xs must be a floating-point torch.Tensor, got {got}")
        if xs.ndim < 1 or xs.shape[-1] != self.n_dims:
            raise ValueError(
                f"xs must have shape (..., n_dims) = (..., {self.n_dims}) for this feature map, got {tuple(xs.shape)}"
            )
        frequencies = self.frequencies.to(dtype=xs.dtype, device=xs.device)
        self._check_phases(xs, frequencies)
        projection = xs @ frequencies
        return torch.cat([torch.cos(projection), torch.sin(projection)], dim=-1)

    def _check_phases(self, xs: torch.Tensor, frequencies: torch.Tensor) -> None:
        """Finite frequencies and inputs, phases within :func:`max_rff_phase` (one device sync)."""
        if not bool(torch.isfinite(self.frequencies).all()):  # a CPU tensor: free
            raise ValueError(f"frequencies must be finite, got {self.frequencies.tolist()}")
        limit = max_rff_phase(xs.dtype)
        finite = torch.isfinite(xs).all(dim=-1)
        phase = (xs.abs() @ frequencies.abs()).amax(dim=-1)  # |x·w| <= Σ_k |x_k| |w_k|; an overflow is inf: refused
        ok = finite & (phase <= limit)
        if bool(ok.all()):
            return
        index = tuple((~ok).nonzero()[0].tolist())
        row = xs[index]
        where = f"xs[{', '.join(map(str, index))}]" if index else "xs"
        if not bool(finite[index]):
            bad = row[~torch.isfinite(row)][0].item()
            raise ValueError(f"xs must hold finite values only, got {bad} in {where}")
        raise ValueError(
            f"xs holds an input too large for random Fourier features in {str(xs.dtype).removeprefix('torch.')}: "
            f"{where} has max |x| = {row.abs().max().item():.6g}, so its phase x·w reaches up to "
            f"{phase[index].item():.6g}, above {limit:.6g} (1 / eps: past it cos and sin of the rounded phase are "
            "noise); scale the inputs down or use float64"
        )

    def __repr__(self) -> str:
        return (
            f"RandomFourierFeatures(n_dims={self.n_dims}, n_frequencies={self.n_frequencies}, "
            f"scale={self.scale:g}, seed={self.seed})"
        )


def max_rff_phase(dtype: torch.dtype) -> float:
    """The largest phase ``|x·w|`` :class:`RandomFourierFeatures` accepts in ``dtype``: ``1 / eps``, where the
    spacing of representable numbers reaches one radian.

    >>> import torch
    >>> max_rff_phase(torch.float32), max_rff_phase(torch.float64)
    (8388608.0, 4503599627370496.0)
    """
    return 1.0 / torch.finfo(dtype).eps


class OnFeatures(InContextEstimator):
    """``estimator`` run on ``features(xs)`` instead of ``xs`` (the labels are unchanged).

    Both protocols carry over: ``OnFeatures(e, φ)(xs, ys) == e(φ(xs), ys)`` and ``predict_queries`` maps the
    context and the queries, then uses ``e``'s own (closed-form, where it has one) ``predict_queries``.

    Args:
        estimator: an :class:`InContextEstimator`.
        features: a callable mapping ``(..., d)`` to ``(..., D)`` row by row, in the input's dtype and device
            (e.g. :class:`RandomFourierFeatures`); its ``name``, if any, goes into this estimator's name.

    >>> import torch
    >>> from hf_icl.estimators import NadarayaWatson, OnFeatures, RandomFourierFeatures
    >>> cosine_on_rff = OnFeatures(NadarayaWatson("cosine"), RandomFourierFeatures())
    >>> cosine_on_rff.name
    'nadaraya_watson(cosine, T=0.1) on rff(32, scale=2)'
    >>> xs = torch.linspace(-3, 3, 40, dtype=torch.float64).reshape(1, 40, 1)
    >>> cosine_on_rff(xs, torch.sin(xs[..., 0])).shape
    torch.Size([1, 40])
    """

    def __init__(self, estimator: InContextEstimator, features: Callable[[torch.Tensor], torch.Tensor]):
        if not isinstance(estimator, InContextEstimator):
            raise ValueError(f"estimator must be an InContextEstimator, got {type(estimator).__name__}")
        if not callable(features):
            raise ValueError(f"features must be callable (a feature map), got {type(features).__name__}")
        self.estimator = estimator
        self.features = features
        self.name = f"{estimator.name} on {getattr(features, 'name', type(features).__name__)}"

    def _predict(self, xs: torch.Tensor, ys: torch.Tensor) -> torch.Tensor:
        return self.estimator(self.features(xs), ys)

    def _predict_queries(
        self, context_xs: torch.Tensor, context_ys: torch.Tensor, query_xs: torch.Tensor
    ) -> torch.Tensor:
        return self.estimator.predict_queries(self.features(context_xs), context_ys, self.features(query_xs))
