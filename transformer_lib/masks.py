"""Boolean attention masks, ``True`` = may attend (chapter 4, "Masking").

Shapes: a causal mask is ``(T_q, T_k)``, a padding mask ``(B, T)``, and the combined mask that
attention layers take is ``(B, 1, T_q, T_k)`` (the ``1`` broadcasts over heads).
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["causal_mask", "combine_masks", "padding_mask"]


def causal_mask(T_q: int, T_k: int | None = None, device: torch.device | str | None = None) -> Tensor:
    """Bool ``(T_q, T_k)``: query ``i`` may attend to key ``j`` only if ``j`` is not in its future.

    With ``T_k > T_q`` the queries are taken to be the *last* ``T_q`` positions of the key
    sequence (as when new tokens attend to a cache of earlier ones), so query ``i`` sees keys
    ``0 .. i + T_k - T_q``. With ``T_q == T_k`` this is the lower triangle including the diagonal.
    """
    T_k = T_q if T_k is None else T_k
    for name, n in (("T_q", T_q), ("T_k", T_k)):
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"{name} must be a positive int, got {n!r}")
    ones = torch.ones(T_q, T_k, dtype=torch.bool, device=device)
    return torch.tril(ones, diagonal=T_k - T_q)


def padding_mask(lengths: Tensor | list[int], max_len: int) -> Tensor:
    """Bool ``(B, max_len)``, True at the real tokens of each sequence, False at the padding."""
    lengths = torch.as_tensor(lengths)
    if lengths.dim() != 1 or lengths.dtype.is_floating_point or lengths.dtype == torch.bool:
        raise TypeError(f"lengths must be a 1-D integer tensor (B,), got dtype {lengths.dtype} shape {tuple(lengths.shape)}")
    if lengths.numel() and (int(lengths.min()) < 0 or int(lengths.max()) > max_len):
        raise ValueError(f"lengths must lie in [0, max_len={max_len}], got {lengths.tolist()}")
    positions = torch.arange(max_len, device=lengths.device)  # (max_len,)
    return positions[None, :] < lengths[:, None]  # (B, max_len)


def combine_masks(
    key_padding_mask: Tensor | None = None, causal: bool = False, T_q: int | None = None
) -> Tensor:
    """Combine a key-padding mask ``(B, T_k)`` and/or a causal mask into ``(B, 1, T_q, T_k)``.

    ``T_q`` defaults to ``T_k`` (self-attention). For cross-attention pass the decoder's length
    as ``T_q`` and leave ``causal=False``.
    """
    if key_padding_mask is None:
        raise ValueError("combine_masks needs a key_padding_mask of shape (B, T_k); use causal_mask alone otherwise")
    if key_padding_mask.dtype != torch.bool or key_padding_mask.dim() != 2:
        raise TypeError(
            f"key_padding_mask must be a bool tensor of shape (B, T_k), got {key_padding_mask.dtype} "
            f"{tuple(key_padding_mask.shape)}"
        )
    B, T_k = key_padding_mask.shape
    T_q = T_k if T_q is None else T_q
    mask = key_padding_mask[:, None, None, :].expand(B, 1, T_q, T_k)  # (B, 1, T_q, T_k)
    if causal:
        mask = mask & causal_mask(T_q, T_k, device=key_padding_mask.device)
    return mask.contiguous()
