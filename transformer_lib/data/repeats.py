"""Random sequences with a repeated segment (chapter "What attention learns"), the probe for induction heads.

A segment of ``repeat_len`` random tokens appears twice, the second time ``distance`` positions
after the first; the distance is drawn anew for every sequence, since with one fixed distance a
single attention layer predicts the repeat by position alone.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .._checks import check_int

__all__ = ["repeat_batch"]


def repeat_batch(
    batch_size: int,
    seq_len: int,
    vocab_size: int,
    repeat_len: int,
    *,
    min_distance: int | None = None,
    max_distance: int | None = None,
    generator: torch.Generator | None = None,
    return_distance: bool = False,
) -> tuple[Tensor, ...]:
    """A batch of random token sequences in which a segment reappears (chapter "What attention learns").

    Each of the ``batch_size`` sequences of ``seq_len + 1`` tokens is drawn uniformly from
    ``0 .. vocab_size - 1``; then a distance ``D`` (uniform in ``[min_distance, max_distance]``,
    defaults ``repeat_len`` and ``seq_len - repeat_len``) and a start ``s`` (uniform, such that
    ``s + D + repeat_len <= seq_len``) are drawn, and positions ``s + D .. s + D + repeat_len - 1``
    are overwritten by a copy of ``s .. s + repeat_len - 1``. Both occurrences lie within ``idx``.

    Returns ``(idx, targets, loss_mask)``, each ``(B, T)`` with ``B = batch_size``, ``T = seq_len``:
    ``idx`` the tokens (int64), ``targets`` the next tokens (``targets[:, t] = token t + 1``) and
    ``loss_mask`` (bool) True exactly at the ``repeat_len - 1`` positions ``t = s + D .. s + D +
    repeat_len - 2`` whose target is predictable from the earlier occurrence (the first token of
    the repeat is not). With ``return_distance`` a fourth tensor, ``distance (B,)`` int64, follows.
    Everything is drawn from ``generator`` (the global generator if None), in a fixed order.
    """
    for name, value in (("batch_size", batch_size), ("seq_len", seq_len), ("vocab_size", vocab_size)):
        check_int(value, name)
    check_int(repeat_len, "repeat_len", minimum=2)
    lo, hi = _distance_range(seq_len, repeat_len, min_distance, max_distance)
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")
    seq = torch.randint(vocab_size, (batch_size, seq_len + 1), generator=generator)  # (B, T + 1)
    distance = torch.randint(lo, hi + 1, (batch_size,), generator=generator)  # (B,)
    loss_mask = torch.zeros(batch_size, seq_len, dtype=torch.bool)  # (B, T)
    for b in range(batch_size):
        d = int(distance[b])
        s = int(torch.randint(seq_len - d - repeat_len + 1, (1,), generator=generator))
        seq[b, s + d : s + d + repeat_len] = seq[b, s : s + repeat_len]
        loss_mask[b, s + d : s + d + repeat_len - 1] = True
    idx, targets = seq[:, :-1].contiguous(), seq[:, 1:].contiguous()  # (B, T) each
    return (idx, targets, loss_mask, distance) if return_distance else (idx, targets, loss_mask)


def _distance_range(
    seq_len: int, repeat_len: int, min_distance: int | None, max_distance: int | None, seq_name: str = ""
) -> tuple[int, int]:
    """``(min_distance, max_distance)`` with their defaults, checked to fit two copies of
    ``repeat_len`` tokens into ``seq_len``; each message names the arguments the caller gave
    (``seq_name`` says what the length is when the caller did not give ``seq_len``)."""
    seq_name = seq_name or f"seq_len={seq_len}"
    if min_distance is not None:
        check_int(min_distance, "min_distance", minimum=repeat_len)  # the copies would overlap
    if max_distance is not None:
        check_int(max_distance, "max_distance")
    lo = repeat_len if min_distance is None else min_distance
    hi = seq_len - repeat_len if max_distance is None else max_distance
    if lo + repeat_len > seq_len:
        given = "repeat_len" if min_distance is None else f"min_distance={min_distance} plus repeat_len"
        raise ValueError(
            f"{seq_name} is too short for the repeats: {given}={repeat_len} needs at least {lo + repeat_len} "
            f"tokens for both copies"
        )
    if hi < lo:
        floor = f"repeat_len={repeat_len}" if min_distance is None else f"min_distance={min_distance}"
        raise ValueError(f"max_distance={hi} is below {floor}")
    if hi + repeat_len > seq_len:
        raise ValueError(
            f"max_distance={hi} plus repeat_len={repeat_len} is longer than {seq_name}: the second occurrence "
            f"would not fit"
        )
    return lo, hi
