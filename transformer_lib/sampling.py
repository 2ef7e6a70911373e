"""Sampling from a language model (chapter 9, "A GPT from scratch"): temperature, top-k and
generating text from a prompt."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

__all__ = ["generate_text", "sample_next", "top_k_filter"]


def top_k_filter(logits: Tensor, k: int) -> Tensor:
    """``logits (..., V)`` with all but the ``k`` largest of each row set to ``-inf`` (chapter 9).

    Ties with the ``k``-th largest value are kept. ``k >= V`` keeps every logit. Same shape out.
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"top_k must be a positive int, got {k!r}")
    kth = torch.topk(logits, min(k, logits.shape[-1]), dim=-1).values[..., -1:]  # (..., 1)
    return logits.masked_fill(logits < kth, float("-inf"))


def sample_next(
    logits: Tensor,
    temperature: float = 1.0,
    top_k: int | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """One token id per row of ``logits (B, V)``, drawn from ``softmax(logits / temperature)``
    after an optional :func:`top_k_filter` (chapter 9); returns ``(B, 1)``."""
    if not (isinstance(temperature, (int, float)) and math.isfinite(temperature) and temperature > 0):
        raise ValueError(f"temperature must be a finite number > 0, got {temperature!r}")
    logits = logits / temperature  # (B, V)
    if top_k is not None:
        logits = top_k_filter(logits, top_k)
    probs = torch.softmax(logits, dim=-1)  # (B, V)
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
