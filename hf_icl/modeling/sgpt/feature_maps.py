"""The one-layer feature maps ψ of the SGPT analysis (seed 001, section 5, eq. 9–12, Appendix B), every prefix at once.

For a prompt ``A = [[x_0, y_0], …, [x_{N-1}, y_{N-1}]]`` (``(N, d+1)``; ``d + C`` columns for one-hot labels) the
document applies ψ to the prefix matrix ``A^i`` (rows ``0..i`` of ``A`` with the label of row ``i`` zeroed, its
``A_t^i``) and reads the last row ``ψ(A^i)_{i,:}``. The functions here return that row for every ``i`` in one
batched computation: row ``i`` of the output is ``ψ(A^i)_{i,:}`` and uses ``x_0..x_i`` and ``y_0..y_{i-1}`` only.

* :func:`psi_linear`: ``ψ_L(A) = (A Aᵀ) A``; its label entry is the one-step-GD estimate ``x_iᵀ Xᵀ y`` (eq. 10).
* :func:`psi_kernel`: ``ψ_K(A) = K̂(X, X) A`` with a zero-diagonal, row-normalised kernel matrix (eq. 11); its label
  entry is the kernel smoother (eq. 12): softmax attention (``"exponential"``), the Hilbert estimate (``"hilbert"``)
  or SGPT's ℓ1-normalised attention over the inputs (``"l1"``).

Example::

    >>> import torch
    >>> from hf_icl.modeling.sgpt import feature_map, prompt_matrix
    >>> xs, ys = torch.randn(2, 6, 3), torch.randn(2, 6)
    >>> feature_map(prompt_matrix(xs, ys), "hilbert").shape  # [smoothed x, smoothed y] at every position
    torch.Size([2, 6, 4])
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ...similarity.gram import pairwise_distances
from ...validation import check_choice, check_float, check_int

#: the feature maps ψ: one-step GD (``"linear"``) and the kernel smoothers of :func:`psi_kernel`
FEATURE_MAPS = ("linear", "exponential", "hilbert", "l1")
#: the kernels of :func:`psi_kernel`
SMOOTHING_KERNELS = ("exponential", "hilbert", "l1")
#: other names of the exponential kernel (NadarayaWatson's)
KERNEL_ALIASES = {"exp": "exponential", "softmax": "exponential"}


def prompt_matrix(xs: torch.Tensor, ys: torch.Tensor) -> torch.Tensor:
    """The document's ``A``: rows ``[x_i, y_i]``, shape ``(..., N, d + 1)``.

    ``ys`` is ``(..., N)`` (one label per row) or ``(..., N, C)`` (encoded labels, e.g. one-hot classes, giving
    ``(..., N, d + C)``); it is cast to the dtype of ``xs``.
    """
    for name, value in (("xs", xs), ("ys", ys)):
        if not isinstance(value, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if not xs.is_floating_point() or xs.ndim < 2:
        raise ValueError(f"xs must be a floating-point tensor of shape (..., N, d), got {xs.dtype} {tuple(xs.shape)}")
    labels = ys.unsqueeze(-1) if ys.shape == xs.shape[:-1] else ys
    if labels.ndim != xs.ndim or labels.shape[:-1] != xs.shape[:-1]:
        raise ValueError(
            f"ys must have shape {tuple(xs.shape[:-1])} or {tuple(xs.shape[:-1])} + (C,) to match xs "
            f"{tuple(xs.shape)}, got {tuple(ys.shape)}"
        )
    return torch.cat((xs, labels.to(xs.dtype)), dim=-1)


def psi_linear(A: torch.Tensor, *, label_width: int = 1) -> torch.Tensor:
    """Row ``i`` is the last row of ``(A^i A^iᵀ) A^i``: ``Σ_{j<i} (x_i·x_j) [x_j, y_j] + ‖x_i‖² [x_i, 0]``.

    ``A`` is ``(..., N, d + label_width)``; the last ``label_width`` columns are labels. Row ``N-1``'s label entry is
    ``x_Nᵀ Xᵀ y`` (eq. 10, one step of gradient descent from 0). Position 0 is ``‖x_0‖² [x_0, 0]``.
    """
    A, dtype = _checked_matrix(A, label_width)
    xs = A[..., :-label_width]
    gram = xs @ xs.transpose(-1, -2)
    # Strictly-lower Gram entries pair x_i with the labelled rows j < i; the diagonal pairs x_i with its own row,
    # whose label A^i hides.
    earlier = gram.tril(-1) @ A
    own = gram.diagonal(dim1=-2, dim2=-1).unsqueeze(-1) * F.pad(xs, (0, label_width))
    return (earlier + own).to(dtype)


def psi_kernel(A: torch.Tensor, kernel: str, bandwidth: float | None = None, *, label_width: int = 1) -> torch.Tensor:
    """Row ``i`` is the last row of ``K̂(X, X) A^i``: ``Σ_{j<i} K(x_i, x_j) [x_j, y_j] / Σ_{j<i} K(x_i, x_j)`` (eq. 11).

    ``A`` is ``(..., N, d + label_width)``. Kernels (``d`` is the number of input columns):

    * ``"exponential"`` (or ``"exp"``, ``"softmax"``): ``K = exp(x·x' / bandwidth)`` (bandwidth 1 by default): softmax
      attention; the label entry equals ``NadarayaWatson(kernel="exp", bandwidth)``.
    * ``"hilbert"``: ``K = ‖x - x'‖^-d`` (no bandwidth; passing one is an error). Earlier points that coincide with
      ``x_i`` (distance exactly 0, infinite weight) are *excluded* from the sum, so a duplicate does not take all the
      weight; :class:`~hf_icl.estimators.NadarayaWatson` does the opposite (it averages the duplicates only), so the
      two differ exactly when a point repeats. A row whose earlier points all coincide with ``x_i`` is zero.
    * ``"l1"``: ``K = x·x'`` normalised by ``Σ_{j<i} |x_i·x_j|``, SGPT's row-wise ℓ1 normalisation (eq. 6) of the
      identity-projection attention over the inputs; a zero normaliser gives a zero row.

    The exponential and Hilbert weights are normalised in log space (a masked log-sum-exp), so huge kernel values
    (close points, a small bandwidth) do not overflow. Position 0 has no earlier point: its row is zero.
    """
    kernel = KERNEL_ALIASES.get(kernel, kernel)
    check_choice("kernel", kernel, SMOOTHING_KERNELS)
    bandwidth = _check_bandwidth(bandwidth, kernel)
    A, dtype = _checked_matrix(A, label_width)
    xs = A[..., :-label_width]
    n_points = A.shape[-2]
    earlier = torch.ones(n_points, n_points, dtype=torch.bool, device=A.device).tril(-1)
    if kernel == "l1":
        gram = (xs @ xs.transpose(-1, -2)).masked_fill(~earlier, 0.0)
        normaliser = gram.abs().sum(-1, keepdim=True)
        weights = gram / torch.where(normaliser > 0, normaliser, 1.0)  # an all-zero row stays zero
        return (weights @ A).to(dtype)
    if kernel == "exponential":
        usable = earlier
        log_weights = xs @ xs.transpose(-1, -2) / bandwidth
    else:
        distances = pairwise_distances(xs)  # exact zeros for coincident points
        usable = earlier & (distances > 0)
        log_weights = -xs.shape[-1] * torch.where(usable, distances, 1.0).log()
    log_weights = log_weights.masked_fill(~usable, float("-inf"))
    normaliser = torch.logsumexp(log_weights, dim=-1, keepdim=True)
    # A row with no usable point has normaliser -inf; 0 keeps exp(-inf - 0) = 0 (and its gradient) free of NaN.
    normaliser = normaliser.masked_fill(normaliser == float("-inf"), 0.0)
    return (torch.exp(log_weights - normaliser) @ A).to(dtype)


def feature_map(A: torch.Tensor, name: str, bandwidth: float | None = None, *, label_width: int = 1) -> torch.Tensor:
    """``ψ(A^i)_{i,:}`` for every position ``i``: :func:`psi_linear` for ``"linear"``, else :func:`psi_kernel`.

    ``bandwidth`` applies to ``"exponential"`` only. Returns the shape and dtype of ``A``.
    """
    name = KERNEL_ALIASES.get(name, name)
    check_choice("name", name, FEATURE_MAPS)
    if name == "linear":
        _check_bandwidth(bandwidth, name)
        return psi_linear(A, label_width=label_width)
    return psi_kernel(A, name, bandwidth, label_width=label_width)


def _check_bandwidth(bandwidth: float | None, name: str) -> float:
    """The exponential kernel's temperature (1 by default); any bandwidth given to another map is an error."""
    if name != "exponential":
        if bandwidth is not None:
            raise ValueError(
                f"bandwidth applies to the 'exponential' feature map only ({name!r} has none), got bandwidth="
                f"{bandwidth!r}"
            )
        return 1.0
    return check_float("bandwidth", 1.0 if bandwidth is None else bandwidth, low=0.0, low_inclusive=False)


def _checked_matrix(A: torch.Tensor, label_width: int) -> tuple[torch.Tensor, torch.dtype]:
    """``A`` in a working dtype of at least float32 (half precision would overflow the Hilbert kernel's powers), and
    its own dtype to return in; a ``ValueError`` for anything that is not ``(..., N, d + label_width)`` floats."""
    check_int("label_width", label_width, low=1)
    if not isinstance(A, torch.Tensor):
        raise ValueError(f"A must be a torch.Tensor, got {type(A).__name__}")
    if not A.is_floating_point():
        raise ValueError(f"A must have a floating-point dtype (float32, float64, …), got {A.dtype}")
    if A.ndim < 2 or A.shape[-2] < 1 or A.shape[-1] <= label_width or math.prod(A.shape[:-2]) < 1:
        raise ValueError(
            f"A must have shape (..., N, d + {label_width}) with N >= 1 and d >= 1 input columns before the "
            f"{label_width} label column(s), got {tuple(A.shape)}"
        )
    return A.to(torch.promote_types(A.dtype, torch.float32)), A.dtype
