"""The names CAB's per-token selection takes, defined once (the PyTorch rule, the fused kernel and CAB's
parameters all import them from here)."""

from __future__ import annotations

#: block scores: Quest's min/max-key bound, the mean key, the largest-norm key (CAB's coarsening)
SCORES = ("bound", "mean", "max_l2")
#: ranking policies; "oracle" ranks blocks by their true attention mass (dense O(N²): an evaluation upper bound)
TOKEN_POLICIES = ("dense", "frc", "frc_low", "hybrid", "magnitude", "oracle", "streaming")
#: budgets: a fraction of each token's visible blocks ("row") or a fixed number of blocks ("topk")
BUDGETS = ("row", "topk")
#: the policies that use FRC's two-hop term, and those that score blocks at all
FRC_POLICIES = ("frc", "frc_low", "hybrid")
SCORED_POLICIES = ("magnitude", *FRC_POLICIES)
#: what the fused kernel runs, in the order of its policy codes (the oracle needs dense scores: no kernel)
FUSED_POLICIES = ("dense", "streaming", "magnitude", *FRC_POLICIES)
FUSED_BUDGETS = BUDGETS
