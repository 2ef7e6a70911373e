"""Boolean attention masks, ``True`` = may attend (chapter "Masking").

Shapes: a causal mask is ``(T_q, T_k)``, a padding mask ``(B, T)``, and the combined mask that
attention layers take is ``(B, 1, T_q, T_k)`` (the ``1`` broadcasts over heads).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from ._checks import check_int

__all__ = [
    "Seq2SeqMasks",
    "additive_mask",
    "causal_mask",
    "combine_masks",
    "padding_mask",
    "seq2seq_masks",
    "sliding_window_mask",
    "to_ignore_mask",
]


def causal_mask(T_q: int, T_k: int | None = None, device: torch.device | str | None = None) -> Tensor:
    """Bool ``(T_q, T_k)``: query ``i`` may attend to key ``j`` only if ``j`` is not in its future (chapter "Masking").

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


def sliding_window_mask(
    T_q: int,
    T_k: int | None = None,
    window: int | None = None,
    *,
    device: torch.device | str | None = None,
) -> Tensor:
    """Bool ``(T_q, T_k)``: causal attention that sees only the last ``window`` positions (chapter "Long context and
    precision").

    Query ``i`` may attend to itself and the ``window - 1`` keys before it, never to the future.
    As in :func:`causal_mask`, with ``T_k > T_q`` the queries are the *last* ``T_q`` positions
    (new tokens attending to a cache), so query ``i`` sits at key position ``p = i + T_k - T_q`` and
    sees keys ``max(0, p - window + 1) .. p``. ``window`` is a positive int (required; it is the
    third argument only so that ``sliding_window_mask(T_q, T_k, window)`` reads naturally);
    ``window >= T_k`` gives :func:`causal_mask`. A window that also keeps the first keys in view
    (StreamingLLM's attention sinks) is chapter "Latent, sparse and sink attention"'s
    :func:`~transformer_lib.sinks.keep_first_mask`.
    """
    T_k = T_q if T_k is None else T_k
    for name, n in (("T_q", T_q), ("T_k", T_k)):
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"{name} must be a positive int, got {n!r}")
    if window is None:
        raise ValueError("sliding_window_mask needs a window (a positive int), got None")
    check_int(window, "window")
    ones = torch.ones(T_q, T_k, dtype=torch.bool, device=device)
    offset = T_k - T_q  # query i sits at key position i + offset
    causal = torch.tril(ones, diagonal=offset)
    recent = ~torch.tril(ones, diagonal=offset - window)
    return causal & recent


def padding_mask(lengths: Tensor | list[int], max_len: int) -> Tensor:
    """Bool ``(B, max_len)``, True at the real tokens of each sequence, False at the padding (chapter "Masking")."""
    lengths = torch.as_tensor(lengths)
    if lengths.dim() != 1 or lengths.dtype.is_floating_point or lengths.dtype == torch.bool:
        raise TypeError(
            f"lengths must be a 1-D integer tensor (B,), got dtype {lengths.dtype} shape {tuple(lengths.shape)}"
        )
    if lengths.numel() and (int(lengths.min()) < 0 or int(lengths.max()) > max_len):
        raise ValueError(f"lengths must lie in [0, max_len={max_len}], got {lengths.tolist()}")
    positions = torch.arange(max_len, device=lengths.device)  # (max_len,)
    return positions[None, :] < lengths[:, None]  # (B, max_len)


def combine_masks(key_padding_mask: Tensor | None = None, causal: bool = False, T_q: int | None = None) -> Tensor:
    """Combine a key-padding mask ``(B, T_k)`` and/or a causal mask into ``(B, 1, T_q, T_k)`` (chapter "Masking").

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


# --- Added in chapter "Masking": conversions to other conventions and the three masks of a
# --- sequence-to-sequence model.


def _check_bool_mask(mask: Tensor, name: str = "mask") -> None:
    if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
        got = mask.dtype if isinstance(mask, Tensor) else type(mask).__name__
        raise TypeError(f"{name} must be a bool tensor (True = may attend), got {got}")


def to_ignore_mask(mask: Tensor) -> Tensor:
    """The book's mask (True = may attend) in the opposite convention, True = "masked out" (chapter "Masking").

    ``torch.nn.MultiheadAttention`` reads its boolean ``key_padding_mask`` ``(B, T_k)`` and
    ``attn_mask`` ``(T_q, T_k)`` this way; pass ``to_ignore_mask(keep)`` there. Same shape as ``mask``.
    """
    _check_bool_mask(mask)
    return ~mask


def additive_mask(mask: Tensor, dtype: torch.dtype = torch.float32, fill: float | None = None) -> Tensor:
    """The book's bool mask as a float mask to *add* to the scores before softmax (chapter "Masking").

    0 where ``mask`` is True (may attend) and ``fill`` where it is False; same shape as ``mask``.
    ``fill`` defaults to *half* the dtype's most negative finite value, ``torch.finfo(dtype).min / 2``
    (exact in every dtype), not to ``finfo.min`` itself: a score added to ``finfo.min`` overflows to
    ``-inf`` as soon as it is negative enough to round past it (in float16, any score below about
    -16), and a row whose keys are all ``-inf`` is NaN after softmax.

    With the default ``fill``, for every score ``s`` with ``|s| <= torch.finfo(dtype).max / 2``:

    * ``s + fill`` is finite (it lies in ``[finfo.min, 0]``), so ``scores + mask`` holds
      no ``inf`` and its softmax no NaN, also on a row whose keys are all masked;
    * on a row with an allowed key, a masked key's weight is exactly 0 whenever the largest allowed
      score exceeds the masked key's score minus ``|fill| - 750`` (``|fill|`` is 32752 in float16
      and far larger in the other dtypes; ``exp`` of anything below -750 is 0 in every dtype),
      so the weights equal those of :func:`~transformer_lib.attention.masked_softmax`;
    * a row whose keys are all masked is uniform when its scores are absorbed by the rounding of
      ``s + fill`` to ``fill``, that is ``|s| < 8`` in float16, ``2**118`` in bfloat16, ``2**102`` in
      float32, ``2**969`` in float64; beyond that (float16 in practice) it stays finite and sums to 1
      but is not exactly uniform. :func:`~transformer_lib.attention.masked_softmax` returns zeros there.

    An explicit ``fill`` is used as given: ``float("-inf")`` gives the form of
    ``torch.nn.Transformer.generate_square_subsequent_mask`` (NaN on a row with no allowed key).
    """
    _check_bool_mask(mask)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating point torch dtype, got {dtype}")
    fill = torch.finfo(dtype).min / 2 if fill is None else fill
    out = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
    return out.masked_fill(~mask, fill)


class Seq2SeqMasks(NamedTuple):
    """The three masks of an encoder-decoder transformer, True = may attend (chapter "Masking")."""

    encoder: Tensor  # (B, 1, T_src, T_src): encoder self-attention, source padding only
    decoder: Tensor  # (B, 1, T_tgt, T_tgt): decoder self-attention, target padding and causal
    cross: Tensor  # (B, 1, T_tgt, T_src): cross-attention, source padding only


def seq2seq_masks(
    src_lengths: Tensor | list[int], tgt_lengths: Tensor | list[int], T_src: int, T_tgt: int
) -> Seq2SeqMasks:
    """The encoder, decoder and cross-attention masks for a right-padded batch (chapter "Masking").

    ``src_lengths`` and ``tgt_lengths`` are ``(B,)`` real lengths; sequences are padded on the
    right to ``T_src`` and ``T_tgt``. Only the decoder's self-attention is causal; the encoder's
    self-attention and the cross-attention (decoder queries, encoder keys) mask the source padding.
    """
    src_keep = padding_mask(src_lengths, T_src)  # (B, T_src)
    tgt_keep = padding_mask(tgt_lengths, T_tgt)  # (B, T_tgt)
    if src_keep.shape[0] != tgt_keep.shape[0]:
        raise ValueError(
            f"src_lengths and tgt_lengths must have the same batch size B, got "
            f"{src_keep.shape[0]} and {tgt_keep.shape[0]}"
        )
    return Seq2SeqMasks(
        encoder=combine_masks(src_keep),  # (B, 1, T_src, T_src)
        decoder=combine_masks(tgt_keep, causal=True),  # (B, 1, T_tgt, T_tgt)
        cross=combine_masks(src_keep, T_q=T_tgt),  # (B, 1, T_tgt, T_src)
    )
