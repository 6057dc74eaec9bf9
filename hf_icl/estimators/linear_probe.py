"""Linear probing: a logistic regression fitted on one episode's context examples alone, the baseline of in-context
classification on real features."""

from __future__ import annotations

import torch

from ..data.episodes import Episodes


def linear_probe(episodes: Episodes, **options) -> torch.Tensor:
    """Linear probing: a scikit-learn ``LogisticRegression`` fitted on each episode's context examples alone (no
    other data), its class probabilities for the episode's queries, ``(E, Q, n_ways)`` float64. ``options`` go to
    ``LogisticRegression`` (default ``max_iter=1000``)."""
    from sklearn.linear_model import LogisticRegression

    n_ways = episodes.classes.shape[1]
    out = torch.zeros(*episodes.query_y.shape, n_ways, dtype=torch.float64)
    for e in range(episodes.context_y.shape[0]):
        probe = LogisticRegression(**({"max_iter": 1000} | options))
        probe.fit(episodes.context_x[e].double().numpy(), episodes.context_y[e].numpy())
        probabilities = torch.from_numpy(probe.predict_proba(episodes.query_x[e].double().numpy()))
        out[e][:, torch.from_numpy(probe.classes_).long()] = probabilities
    return out
