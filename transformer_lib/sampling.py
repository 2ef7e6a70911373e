"""Sampling from a language model (chapter "A GPT from scratch"): temperature, top-k and
generating text from a prompt; nucleus (top-p) sampling is added in chapter "Generation"."""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
from torch import Tensor, nn

from ._checks import check_float_tensor, check_int, check_temperature, is_real

__all__ = ["check_top_p", "generate_text", "generate_tokens", "sample_next", "top_k_filter", "top_p_filter"]


def top_k_filter(logits: Tensor, k: int) -> Tensor:
    """``logits (..., vocab_size)`` with all but the ``k`` largest of each row set to ``-inf`` (chapter "A GPT from
    scratch").

    Ties with the ``k``-th largest value are kept. ``k >= V`` keeps every logit. Same shape out.
    ``k`` must be a positive int: ``TypeError`` for a float or a bool, ``ValueError`` below 1.
    """
    check_float_tensor(logits, "logits")
    check_int(k, "top_k")
    return _top_k(logits, k)


def _top_k(logits: Tensor, k: int) -> Tensor:
    """:func:`top_k_filter` for a ``k`` already checked."""
    kth = torch.topk(logits, min(k, logits.shape[-1]), dim=-1).values[..., -1:]  # (..., 1)
    return logits.masked_fill(logits < kth, float("-inf"))


def check_top_p(p, name: str = "top_p") -> None:
    """Raise unless ``p`` is a number in ``(0, 1]`` (a nucleus-sampling mass, chapter "Generation"):
    ``TypeError`` for a non-number (or a bool), ``ValueError`` for 0, a negative, above 1 or NaN."""
    if not is_real(p):
        raise TypeError(f"{name} must be a number in (0, 1], got {p!r} ({type(p).__name__})")
    if not (0.0 < float(p) <= 1.0) or math.isnan(float(p)):
        raise ValueError(f"{name} must be a probability mass in (0, 1], got {p!r}")


def top_p_filter(logits: Tensor, p: float) -> Tensor:
    """``logits (..., vocab_size)`` with every token outside the nucleus set to ``-inf`` (chapter "Generation").

    The nucleus of a row is the smallest set of most likely tokens whose probabilities
    (``softmax(logits)``) add up to at least ``p``; the most likely token is always in it.
    Tokens tied with the least likely member are kept too (as :func:`top_k_filter` keeps ties),
    so the result never depends on how a sort orders equal logits. ``p = 1`` keeps every token.
    ``p`` is a number in ``(0, 1]``. Same shape and dtype out.
    """
    check_float_tensor(logits, "logits")
    check_top_p(p)
    return _top_p(logits, p)


def _top_p(logits: Tensor, p: float) -> Tensor:
    """:func:`top_p_filter` for a ``p`` already checked."""
    if p >= 1.0:
        return logits
    sorted_logits, _ = torch.sort(logits, dim=-1, descending=True)  # (..., vocab_size)
    probs = torch.softmax(sorted_logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs  # (..., vocab_size): the mass of the more likely tokens
    inside = mass_before < p  # a prefix of each sorted row; the first entry is always True (0 < p)
    last = (inside.sum(dim=-1, keepdim=True) - 1).clamp(min=0)  # (..., 1): the least likely member (NaN rows: 0)
    threshold = sorted_logits.gather(-1, last)  # (..., 1)
    return logits.masked_fill(logits < threshold, float("-inf"))


def sample_next(
    logits: Tensor,
    temperature: float = 1.0,
    top_k: int | None = None,
    *,
    generator: torch.Generator | None = None,
    top_p: float | None = None,
) -> Tensor:
    """One token id per row of ``logits (B, vocab_size)``, drawn from ``softmax(logits / temperature)``
    after an optional :func:`top_k_filter` (chapter "A GPT from scratch"); returns ``(B, 1)``.

    ``temperature`` is a finite number > 0. One so small that ``logits / temperature``
    overflows gives the limit ``tau -> 0``: a uniform choice among each row's largest logits.
    ``top_p`` (chapter "Generation") then applies :func:`top_p_filter` to the tempered, top-k-filtered
    logits: temperature first, then top-k, then top-p.
    """
    check_temperature(temperature)
    if top_k is not None:
        check_int(top_k, "top_k")
    if top_p is not None:
        check_top_p(top_p)
    return _sample(logits, temperature, top_k, generator, top_p)


def _sample(
    logits: Tensor, temperature: float, top_k: int | None, generator: torch.Generator | None, top_p: float | None
) -> Tensor:
    """:func:`sample_next` for settings already checked (once per generation, not once per token)."""
    scaled = logits / temperature if temperature != 1 else logits  # (B, vocab_size); x / 1 is x
    if top_k is not None:
        scaled = _top_k(scaled, top_k)
    if top_p is not None:
        scaled = _top_p(scaled, top_p)
    probs = torch.softmax(scaled, dim=-1)  # (B, vocab_size)
    if not bool(torch.isfinite(probs).all()):  # the division overflowed: take the tau -> 0 limit
        if not bool(torch.isfinite(logits).all()):  # read only here: no cost when the model is sound
            raise FloatingPointError(
                "the model's outputs (logits) are not finite (NaN or inf), so no token can be sampled: its "
                "weights hold NaN or inf (a diverged training run, or a damaged file)"
            )
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
    top_p: float | None = None,
) -> str:
    """``prompt`` followed by ``max_new_tokens`` sampled tokens (chapter "A GPT from scratch").

    ``model`` is a :class:`~transformer_lib.models.GPT` and ``tokenizer`` the tokenizer it was
    trained with, a :class:`~transformer_lib.data.CharTokenizer` or (chapter "Tokens") a BPE tokenizer; the prompt
    becomes a ``(1, T)`` batch for :meth:`GPT.generate`. The model's train/eval mode is restored afterwards.
    ``top_p`` (chapter "Generation") is passed on to :meth:`GPT.generate` (nucleus sampling).
    """
    if not prompt:
        raise ValueError("the prompt must have at least one character (for example a newline)")
    device = next(model.parameters()).device
    idx = torch.tensor([tokenizer.encode(prompt)], dtype=torch.long, device=device)  # (1, T)
    was_training = model.training
    model.eval()
    out = model.generate(idx, max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p, generator=generator)
    model.train(was_training)
    return tokenizer.decode(out[0])


@torch.inference_mode()
def generate_tokens(
    model: nn.Module,
    idx: Tensor,
    max_new_tokens: int,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
    stop_id: int | None = None,
) -> Iterator[int]:
    """The tokens a :class:`~transformer_lib.models.GPT` appends to the prompt ``idx (1, T)``, one
    at a time as each is drawn, up to ``max_new_tokens`` of them, or up to and including
    ``stop_id`` (a fine-tuned model's end token) when it is drawn (chapter "A GPT from scratch").

    The same tokens as :meth:`GPT.generate` with the same settings and generator: the prompt is
    run once with a cache, each new token alone after it, and past ``context_len`` the cropped
    window uncached. Stopping early saves the steps that :meth:`GPT.generate` would take after
    the end token; a caller interrupted between two tokens keeps the ones already yielded.
    """
    if idx.dim() != 2 or idx.shape[0] != 1 or idx.shape[1] < 1:
        raise ValueError(f"idx must be one prompt of at least one token, shape (1, T), got {tuple(idx.shape)}")
    check_int(max_new_tokens, "max_new_tokens", minimum=0)
    check_temperature(temperature)
    if top_k is not None:
        check_int(top_k, "top_k")
    if top_p is not None:
        check_top_p(top_p)
    L = model.config.context_len
    cache = model.new_cache()
    for step in range(max_new_tokens):
        if step == 0:
            logits, _ = model(idx[:, -L:], cache=cache)  # the prompt, once: (1, T, vocab_size)
        elif idx.shape[1] <= L:
            logits, _ = model(idx[:, -1:], cache=cache)  # the newest token after the cache: (1, 1, vocab_size)
        else:
            logits, _ = model(idx[:, -L:])  # past context_len: the cropped window, uncached
        nxt = _sample(logits[:, -1, :], temperature, top_k, generator, top_p)  # (1, 1)
        idx = torch.cat([idx, nxt], dim=1)
        token = int(nxt)
        yield token
        if token == stop_id:
            return
