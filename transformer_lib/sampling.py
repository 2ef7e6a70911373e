"""Sampling from a language model (chapter 9, "A GPT from scratch"): temperature, top-k and
generating text from a prompt."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ._checks import check_int, check_temperature

__all__ = ["generate_text", "sample_next", "top_k_filter"]


def top_k_filter(logits: Tensor, k: int) -> Tensor:
    """``logits (..., V)`` with all but the ``k`` largest of each row set to ``-inf`` (chapter 9).

    Ties with the ``k``-th largest value are kept. ``k >= V`` keeps every logit. Same shape out.
    ``k`` must be a positive int: ``TypeError`` for a float or a bool, ``ValueError`` below 1.
    """
    check_int(k, "top_k")
    kth = torch.topk(logits, min(k, logits.shape[-1]), dim=-1).values[..., -1:]  # (..., 1)
    return logits.masked_fill(logits < kth, float("-inf"))


def sample_next(
    logits: Tensor,
    temperature: float = 1.0,
    top_k: int | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """One token id per row of ``logits (B, V)``, drawn from ``softmax(logits / temperature)``
    after an optional :func:`top_k_filter` (chapter 9); returns ``(B, 1)``.

    ``temperature`` is a finite number > 0. One so small that ``logits / temperature``
    overflows gives the limit ``T -> 0``: a uniform choice among each row's largest logits.
    """
    check_temperature(temperature)
    if top_k is not None:
        check_int(top_k, "top_k")
    scaled = logits / temperature  # (B, V)
    if top_k is not None:
        scaled = top_k_filter(scaled, top_k)
    probs = torch.softmax(scaled, dim=-1)  # (B, V)
    if not bool(torch.isfinite(probs).all()):  # the division overflowed: take the T -> 0 limit
        probs = (logits == logits.amax(dim=-1, keepdim=True)).to(logits.dtype)
    return torch.multinomial(probs, num_samples=1, generator=generator)  # (B, 1)


def generate_text(
    model: nn.Module,
    tokenizer,
    prompt: str = "\n",
    max_new_tokens: int = 200,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    generator: torch.Generator | None = None,
) -> str:
    """``prompt`` followed by ``max_new_tokens`` sampled characters (chapter 9).

    ``model`` is a :class:`~transformer_lib.models.GPT` and ``tokenizer`` the
    :class:`~transformer_lib.data.CharTokenizer` it was trained with; the prompt becomes a
    ``(1, T)`` batch for :meth:`GPT.generate`. The model's train/eval mode is restored afterwards.
    """
    if not prompt:
        raise ValueError("the prompt must have at least one character (for example a newline)")
    device = next(model.parameters()).device
    idx = torch.tensor([tokenizer.encode(prompt)], dtype=torch.long, device=device)  # (1, T)
    was_training = model.training
    model.eval()
    out = model.generate(idx, max_new_tokens, temperature=temperature, top_k=top_k, generator=generator)
    model.train(was_training)
    return tokenizer.decode(out[0])
