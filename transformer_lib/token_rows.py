"""Trainable token rows beside LoRA's adapters (chapter "Fine-tuning"): the fix for a fine-tune whose data
uses tokens the base model never saw.

A token that never occurs in pretraining gets no gradient as an input, and as an output only "never
predict this": its embedding row ends where the others pushed it, next to every other unseen row
(chapter "Tokens"). LoRA freezes the embedding, so a fine-tune whose answers are made of such tokens
(the dates of chapter "Fine-tuning" are digits, and Tiny Shakespeare has one digit) reads inputs it cannot
tell apart. :func:`add_token_rows` makes chosen rows trainable, and can first re-initialise them
(:func:`unseen_token_rows` finds the ones pretraining never used); every other row stays frozen,
bit for bit. ``peft`` calls the same idea ``trainable_token_indices``.

The rows are a parametrization of the embedding's weight, ``W -> W`` with ``W[rows] += delta``, so
a tied output head (GPT-2's, the book's GPT by default) reads the same rows: the two stay tied.

>>> rows = tl.unseen_token_rows(tokenizer, pretrain_text, among=pairs)
>>> tl.add_lora(model, tl.lora_targets(model), rank=4, alpha=8)
>>> tl.add_token_rows(model, rows, reinit=True)  # len(rows) * d_model more
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn
from torch.nn.utils import parametrize

from ._checks import check_bool, is_int
from .parts import find_parts

__all__ = ["TokenRows", "add_token_rows", "remove_token_rows", "token_rows", "unseen_token_rows"]


class TokenRows(nn.Module):
    """The parametrization ``W -> W`` with ``delta`` added to rows ``rows`` of ``W (vocab, d)`` (chapter "Fine-tuning").

    ``delta (len(rows), d)`` starts at zero, or (``reinit``) at ``new - W[rows]`` with ``new`` drawn
    as GPT-2 draws an embedding row, ``N(0, 0.02)``: the rows then start afresh. ``forward(W)``
    returns a new ``(vocab, d)`` tensor; ``W`` itself never changes.
    """

    def __init__(self, weight: Tensor, rows: Sequence[int], reinit: bool = False, seed: int = 0):
        super().__init__()
        index = torch.tensor(list(rows), dtype=torch.long, device=weight.device)
        self.register_buffer("rows", index)
        self.delta = nn.Parameter(torch.zeros(len(index), weight.shape[1], dtype=weight.dtype, device=weight.device))
        if reinit:
            g = torch.Generator().manual_seed(seed)
            fresh = 0.02 * torch.randn(self.delta.shape, generator=g, dtype=torch.float64)
            with torch.no_grad():
                self.delta.copy_(fresh.to(weight.dtype) - weight.detach()[index])

    def forward(self, weight: Tensor) -> Tensor:
        """``weight (N, d)`` (``N`` the vocabulary) -> ``(N, d)``: the chosen rows moved by ``delta``."""
        return weight.index_add(0, self.rows, self.delta)

    def extra_repr(self) -> str:
        return f"rows={len(self.rows)}, d={self.delta.shape[1]}"


def unseen_token_rows(tokenizer, text: str, among: str | None = None) -> list[int]:
    """The ids of the tokens that ``tokenizer.encode_ordinary(text)`` (or ``encode``) never produces,
    in increasing order (chapter "Fine-tuning"); with ``among``, only those that occur in ``among`` (the
    fine-tuning data), since only they matter there."""
    if not isinstance(text, str) or (among is not None and not isinstance(among, str)):
        raise TypeError("text and among must be strings (the pretraining text; the fine-tuning text)")
    encode = getattr(tokenizer, "encode_ordinary", tokenizer.encode)
    seen = set(encode(text))
    wanted = range(tokenizer.vocab_size) if among is None else sorted(set(encode(among)))
    return [i for i in wanted if i not in seen]


def _owners(model: nn.Module) -> list[tuple[nn.Module, str]]:
    """The token embedding's module, and the output head's if it shares the embedding's matrix."""
    embeddings = [m for name, m in find_parts(model, "embedding").items() if not name.endswith("pos_embed")]
    if len(embeddings) != 1 or not isinstance(embeddings[0], nn.Embedding):
        raise ValueError(
            f"{type(model).__name__} has no single token embedding (part role 'embedding') to train rows of"
        )
    owners = [(embeddings[0], "weight")]
    for head in find_parts(model, "head").values():
        if head.weight is embeddings[0].weight:  # tied (GPT-2): the head reads the same rows
            owners.append((head, "weight"))
    return owners


def add_token_rows(model: nn.Module, rows: Sequence[int], *, reinit: bool = False, seed: int = 0) -> int:
    """Make rows ``rows`` of ``model``'s token embedding trainable (chapter "Fine-tuning"); returns the number
    of numbers they add, ``len(rows) * d_model``. Every other weight keeps its ``requires_grad``;
    the embedding's other rows never change. ``reinit`` starts the rows afresh (:class:`TokenRows`).
    A tied output head reads the same rows. An empty list, an id out of range, a repeated id or a
    second call is refused by name."""
    check_bool(reinit, "reinit")
    owners = _owners(model)
    if token_rows(model) is not None:
        raise ValueError("the model's token embedding already has trainable rows (remove_token_rows first)")
    weight = owners[0][0].weight
    rows = list(rows)
    if not rows or not all(is_int(i) for i in rows):
        raise ValueError(f"rows must be a non-empty list of token ids, got {rows!r}")
    bad = [i for i in rows if not 0 <= i < weight.shape[0]]
    if bad or len(set(rows)) != len(rows):
        what = f"ids outside [0, {weight.shape[0]})" if bad else "repeated ids"
        raise ValueError(f"rows holds {what}: {bad or sorted(i for i in rows if rows.count(i) > 1)}")
    update = TokenRows(weight, [int(i) for i in rows], reinit=reinit, seed=seed)
    for module, name in owners:
        parametrize.register_parametrization(module, name, update)
    return update.delta.numel()


def token_rows(model: nn.Module) -> TokenRows | None:
    """The :class:`TokenRows` of ``model``'s token embedding, or None (chapter "Fine-tuning")."""
    module = _owners(model)[0][0]
    if not parametrize.is_parametrized(module, "weight"):
        return None
    return next((p for p in module.parametrizations.weight if isinstance(p, TokenRows)), None)


def remove_token_rows(model: nn.Module, merge: bool = True) -> None:
    """Take the trainable rows off (chapter "Fine-tuning"): ``merge`` keeps their trained values in the embedding
    (a plain weight again, still tied to the head), otherwise the embedding is as it was before."""
    owners = _owners_parametrized(model)
    merged = owners[0][0].weight.detach().clone()  # computed once: a tied head shares the original
    for module, name in owners:
        parametrize.remove_parametrizations(module, name, leave_parametrized=False)
    if merge:
        with torch.no_grad():
            owners[0][0].weight.copy_(merged)
    if len(owners) == 2:  # the head reads the embedding's plain weight again
        owners[1][0].weight = owners[0][0].weight


def _owners_parametrized(model: nn.Module) -> list[tuple[nn.Module, str]]:
    if token_rows(model) is None:
        raise ValueError("the model's token embedding has no trainable rows")
    embed = _owners(model)[0][0]
    heads = [h for h in find_parts(model, "head").values() if parametrize.is_parametrized(h, "weight")]
    return [
        (embed, "weight"),
        *((h, "weight") for h in heads if h.parametrizations.weight.original is embed.parametrizations.weight.original),
    ]
