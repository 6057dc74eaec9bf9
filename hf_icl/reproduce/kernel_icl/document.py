"""The kernel-ICL document's numbers and names (seed 000): its row kernels, Tables 1 and 2 as it reports them, and
the labels the tables and figures give each (row kernel, column attention) model."""

from __future__ import annotations

ROW_KERNELS = ("softmax", "cosine", "cayley", "ga")
#: how the document names the row kernels
KERNEL_NAMES = {"softmax": "Softmax", "cosine": "Cosine", "cayley": "Cayley", "ga": "GA"}

#: Table 1 (1-D sin(x)): method -> (label, kernel as the document writes it, the document's MSE)
TABLE1 = {
    "ridge": ("Ridge (λ = 1)", "linear", 0.1713),
    "raw_attention": ("Attention ICL (raw)", "softmax of xᵀx'", 0.0806),
    "nadaraya_watson": ("Nadaraya–Watson (RBF, σ = 0.5)", "RBF", 0.0147),
    "ga": ("GA ICL (penalty)", "(β₁ cos θ − β₂ sin θ)/T, β = (4, 1), T = 1", 0.0082),
    "cayley": ("Cayley ICL", "−θ²/(2T²), T = 0.1", 0.0074),
    "kernel_ridge": ("KRR (RBF, σ = 0.5, λ = 0.01)", "RBF", 0.0042),
    "pretrained": ("Pre-trained attention head", "learned softmax", 0.0039),
    "cosine": ("Cosine ICL", "cos θ / T, T = 0.1", 0.0038),
}
#: Table 2 (10-D latent groups): (row kernel, column attention) -> the document's MSE; and its KRR (σ = 3)
TABLE2 = {
    ("softmax", False): 0.0997,
    ("softmax", True): 0.0780,
    ("cosine", False): 0.0864,
    ("cosine", True): 0.0718,
    ("cayley", False): 0.0861,
    ("cayley", True): 0.0718,
    ("ga", False): 0.0862,
    ("ga", True): 0.0720,
}
TABLE2_KRR = 0.1165


def grid_name(kernel: str, column: bool) -> str:
    return f"{'col' if column else 'row'}_{kernel}"


def grid_label(kernel: str, column: bool) -> str:
    return f"{'Col+' if column else 'Row '}{KERNEL_NAMES[kernel]}"
