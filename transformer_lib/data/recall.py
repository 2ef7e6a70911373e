"""Associative recall (chapter "Attention as a recurrence"): a model reads key-value pairs, then is asked for the value
of some keys. What a fixed-size state forgets and a growing cache keeps, measured by one number,
the number of pairs.

Tokens: the keys are ``0 .. n_keys - 1``, the values ``n_keys .. n_keys + n_values - 1``, then one
separator. A sequence is ``k_1 v_1 k_2 v_2 ... k_n v_n SEP q_1 a_1 q_2 a_2 ...``: ``n_pairs``
pairs with distinct keys and random values, the separator, then ``n_queries`` of those keys
(distinct, in random order), each followed by its value. Only the answers are scored.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from .._checks import check_int

__all__ = ["RecallBatch", "recall_accuracy", "recall_batch", "recall_vocab_size"]


class RecallBatch(NamedTuple):
    """One batch of associative recall (chapter "Attention as a recurrence"): ``idx``, ``targets`` (the next tokens) and
    ``loss_mask`` (True where the target is a queried key's value), each ``(B, T)``."""

    idx: Tensor
    targets: Tensor
    loss_mask: Tensor


def recall_vocab_size(n_keys: int, n_values: int) -> int:
    """The vocabulary of :func:`recall_batch` (chapter "Attention as a recurrence"): the keys, the values and the
    separator."""
    check_int(n_keys, "n_keys")
    check_int(n_values, "n_values")
    return n_keys + n_values + 1


def recall_batch(
    batch_size: int,
    n_pairs: int,
    *,
    n_keys: int = 64,
    n_values: int = 64,
    n_queries: int | None = None,
    generator: torch.Generator | None = None,
) -> RecallBatch:
    """A batch of associative recall sequences (chapter "Attention as a recurrence").

    Each of the ``batch_size`` sequences holds ``n_pairs`` key-value pairs (keys drawn without
    replacement from ``n_keys``, values uniformly from ``n_values``), a separator, then
    ``n_queries`` (default ``n_pairs``, at most ``n_pairs``) of its keys, each followed by its value.
    Returns a :class:`RecallBatch` of ``(B, T)`` tensors with ``T = 2 n_pairs + 2 n_queries``:
    ``idx`` the tokens (int64) without the last one, ``targets`` the next tokens, and
    ``loss_mask`` True exactly at the ``n_queries`` positions of the queried keys, whose target is
    the answer. The vocabulary is :func:`recall_vocab_size`.
    """
    for value, name in ((batch_size, "batch_size"), (n_pairs, "n_pairs"), (n_keys, "n_keys"), (n_values, "n_values")):
        check_int(value, name)
    n_queries = n_pairs if n_queries is None else n_queries
    check_int(n_queries, "n_queries")
    if n_pairs > n_keys:
        raise ValueError(f"n_pairs={n_pairs} distinct keys need n_keys >= n_pairs, got n_keys={n_keys}")
    if n_queries > n_pairs:
        raise ValueError(f"n_queries={n_queries} distinct queried keys need n_queries <= n_pairs={n_pairs}")
    B = batch_size
    keys = torch.rand(B, n_keys, generator=generator).argsort(dim=1)[:, :n_pairs]  # (B, n): distinct keys
    values = n_keys + torch.randint(n_values, (B, n_pairs), generator=generator)  # (B, n)
    asked = torch.rand(B, n_pairs, generator=generator).argsort(dim=1)[:, :n_queries]  # (B, q): which pairs
    pairs = torch.stack([keys, values], dim=2).reshape(B, 2 * n_pairs)  # k_1 v_1 k_2 v_2 ...
    questions = torch.stack([keys.gather(1, asked), values.gather(1, asked)], dim=2).reshape(B, 2 * n_queries)
    separator = torch.full((B, 1), n_keys + n_values)
    tokens = torch.cat([pairs, separator, questions], dim=1)  # (B, T + 1)
    loss_mask = torch.zeros(B, tokens.shape[1] - 1, dtype=torch.bool)
    loss_mask[:, 2 * n_pairs + 1 :: 2] = True  # the queried keys: their next token is the answer
    return RecallBatch(tokens[:, :-1], tokens[:, 1:], loss_mask)


@torch.no_grad()
def recall_accuracy(model: torch.nn.Module, batch: RecallBatch) -> float:
    """The share of queried keys whose value ``model`` predicts exactly (greedy, chapter "Attention as a recurrence"):
    ``model(batch.idx)`` returns ``(logits (B, T, V), ...)``, as a GPT does."""
    if not isinstance(batch, RecallBatch):
        raise TypeError(f"batch must be a RecallBatch (recall_batch(...)), got {type(batch).__name__}")
    logits = model(batch.idx)[0]  # (B, T, V)
    right = logits.argmax(-1) == batch.targets  # (B, T)
    return float(right[batch.loss_mask].float().mean())
