"""Few-shot classification episodes from any labelled feature set, and a fixed feature map of scikit-learn's bundled
digits (held-out classes never touch it).

An episode draws ``n_ways`` classes in a random order (label ``k`` is the ``k``-th drawn class, a fresh class→label
permutation per episode), ``n_shots`` context examples of each and some queries; :meth:`Episodes.prompts` turns them
into the package's ICL prompts (the context, then one query), so any categorical in-context learner — the
functional-GD transformer, GPT-2 ICL — classifies held-out classes from the context alone. Your own embeddings work
as they are: pass ``(features, labels)`` arrays.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import torch

from ..validation import check_int


@dataclass
class Episodes:
    """Few-shot episodes: ``n_ways`` classes each, labels ``0 … n_ways − 1`` in a random class order per episode.

    Attributes:
        context_x: ``(E, n_ways · n_shots, d)`` context features, in random order.
        context_y: ``(E, n_ways · n_shots)`` their episode labels.
        query_x: ``(E, n_queries, d)``; query_y: ``(E, n_queries)`` (uniform over the episode's classes).
        classes: ``(E, n_ways)``: label ``k`` of episode ``e`` is the original class ``classes[e, k]``.
    """

    context_x: torch.Tensor
    context_y: torch.Tensor
    query_x: torch.Tensor
    query_y: torch.Tensor
    classes: torch.Tensor

    def prompts(self) -> tuple[torch.Tensor, torch.Tensor]:
        """One prompt per query, the episode's context followed by the query: ``xs (E · Q, N + 1, d)`` and
        ``ys (E · Q, N + 1)`` (query ``q`` of episode ``e`` at row ``e · Q + q``); the model's prediction at the last
        position is the query's."""
        episodes, n_queries = self.query_y.shape
        context_x = self.context_x.repeat_interleave(n_queries, dim=0)
        context_y = self.context_y.repeat_interleave(n_queries, dim=0)
        xs = torch.cat([context_x, self.query_x.reshape(episodes * n_queries, 1, -1)], dim=1)
        ys = torch.cat([context_y, self.query_y.reshape(episodes * n_queries, 1)], dim=1)
        return xs, ys


def sample_episodes(
    features,
    labels,
    n_episodes: int,
    *,
    n_ways: int,
    n_shots: int,
    n_queries: int = 1,
    classes: Sequence[int] | None = None,
    generator: torch.Generator | None = None,
    seed: int | None = None,
) -> Episodes:
    """Draw ``n_episodes`` episodes from any labelled feature set (your own embeddings work as they are).

    Each episode picks ``n_ways`` of ``classes`` (default: every label present) in a random order — label ``k`` is
    the ``k``-th picked class, a fresh class→label permutation per episode — then ``n_shots`` distinct examples of
    each class for the context (shuffled) and ``n_queries`` queries, each of a uniformly drawn episode class and never
    one of the context's examples (every class needs ``n_shots + n_queries`` examples).

    Args:
        features: ``(M, d)`` float array or tensor; labels: ``(M,)`` integer class of each row.
        classes: the classes to draw from (e.g. the training or the held-out classes).
        generator / seed: the random stream (one of them, or neither for torch's global one).

    Example::

        >>> import torch
        >>> features, labels = torch.randn(300, 8), torch.arange(300) % 6
        >>> episodes = sample_episodes(features, labels, 4, n_ways=3, n_shots=5, n_queries=2, classes=[0, 1, 2], seed=0)
        >>> xs, ys = episodes.prompts()  # 8 prompts: 15 context pairs, then a query
        >>> xs.shape, ys.shape
        (torch.Size([8, 16, 8]), torch.Size([8, 16]))
    """
    features = torch.as_tensor(features)
    labels = torch.as_tensor(labels)
    if features.ndim != 2 or not features.is_floating_point():
        raise ValueError(f"features must be a floating-point (M, d) array, got shape {tuple(features.shape)}")
    if labels.shape != features.shape[:1] or labels.is_floating_point():
        raise ValueError(f"labels must be (M,) = ({features.shape[0]},) integer classes, got {tuple(labels.shape)}")
    check_int("n_episodes", n_episodes, low=1)
    check_int("n_shots", n_shots, low=1)
    check_int("n_queries", n_queries, low=1)
    present = labels.unique()
    pool = present if classes is None else torch.as_tensor(list(classes), dtype=labels.dtype)
    missing = sorted(set(pool.tolist()) - set(present.tolist()))
    if missing or len(pool) == 0 or len(set(pool.tolist())) != len(pool):
        raise ValueError(
            f"classes must be distinct labels that occur in labels, got {list(pool.tolist())} (absent: {missing})"
        )
    check_int("n_ways", n_ways, low=2, high=len(pool))
    members = [torch.nonzero(labels == c).flatten() for c in pool.tolist()]
    sizes = torch.tensor([len(m) for m in members])
    needed = n_shots + n_queries
    if int(sizes.min()) < needed:
        small = pool[sizes < needed].tolist()
        raise ValueError(
            f"every class needs n_shots + n_queries = {needed} examples; classes {small} have {sizes.min().item()}"
        )
    if generator is not None and seed is not None:
        raise ValueError("pass either generator= or seed=, not both")
    if seed is not None:
        generator = torch.Generator().manual_seed(check_int("seed", seed, low=0))
    padded = torch.nn.utils.rnn.pad_sequence(members, batch_first=True)  # (P, M_max)
    order = torch.rand(n_episodes, len(pool), generator=generator).argsort(dim=1)[:, :n_ways]  # (E, n_ways)
    # distinct examples per (episode, class): the first `needed` of a random order of the class's members
    keys = torch.rand(n_episodes, n_ways, padded.shape[1], generator=generator)
    keys = keys.masked_fill(torch.arange(padded.shape[1]) >= sizes[order][..., None], math.inf)
    picks = padded[order[..., None], keys.argsort(dim=-1)[..., :needed]]  # (E, n_ways, needed) row indices
    n_context = n_ways * n_shots
    context_rows = picks[..., :n_shots].reshape(n_episodes, n_context)
    context_y = torch.arange(n_ways).repeat_interleave(n_shots).expand(n_episodes, n_context)
    shuffle = torch.rand(n_episodes, n_context, generator=generator).argsort(dim=1)
    context_rows, context_y = context_rows.gather(1, shuffle), context_y.gather(1, shuffle)
    query_y = torch.randint(n_ways, (n_episodes, n_queries), generator=generator)
    episode = torch.arange(n_episodes)[:, None]
    query_rows = picks[episode, query_y, n_shots + torch.arange(n_queries)]  # query j uses candidate j of its class
    return Episodes(features[context_rows], context_y, features[query_rows], query_y, pool[order])


@lru_cache(maxsize=4)
def digit_features(train_classes: tuple[int, ...], n_components: int) -> tuple[torch.Tensor, torch.Tensor]:
    """scikit-learn's bundled digits (1797 × 64) through a fixed map: PCA fitted on the training classes' images
    only (centred on their mean, the top ``n_components`` directions), then one scale that gives the training
    classes' features mean norm 1. Returns ``(features (1797, n_components) float32, labels (1797,))``; the held-out
    classes never touch the map."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = torch.tensor(digits.data, dtype=torch.float64)
    labels = torch.tensor(digits.target, dtype=torch.long)
    check_int("n_components", n_components, low=1, high=images.shape[1])
    train = torch.isin(labels, torch.tensor(train_classes))
    mean = images[train].mean(dim=0)
    _, _, directions = torch.linalg.svd(images[train] - mean, full_matrices=False)
    features = (images - mean) @ directions[:n_components].T
    features = features / features[train].norm(dim=1).mean()
    return features.float(), labels
