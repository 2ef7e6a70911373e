"""Fine-tuning a pretrained GPT (chapter 15, "Fine-tuning"): a classification head on its
features, the choice of what to train (the head, low-rank adapters, or everything), the
batches of a labelled task for :func:`~transformer_lib.train.train`, and the measures the
chapter reports: accuracy with its interval, and answers generated up to the end token.

The training loop is :func:`~transformer_lib.train.train`, unchanged: a
:class:`GPTClassifier` returns ``(logits, loss)`` like every model the loop trains, and
:class:`ClassBatches` returns its keyword arguments.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from ._checks import check_int
from .data.batches import _Batches
from .lora import add_lora, count_parameters
from .models import GPT

__all__ = [
    "FINETUNE_METHODS",
    "LORA_TARGETS",
    "ClassBatches",
    "GPTClassifier",
    "accuracy",
    "answers",
    "prepare_finetune",
    "wilson_interval",
]

#: What each method trains: the head only, low-rank adapters and the head, or every weight.
FINETUNE_METHODS = ("head", "lora", "full")

#: The weights chapter 15 adapts with LoRA: every matrix of every block (attention and MLP).
LORA_TARGETS = ("*.self_attn.in_proj_weight", "*.self_attn.out_proj.weight", "*.ff.net.*.weight")


class GPTClassifier(nn.Module):
    """A :class:`~transformer_lib.models.GPT` read by a linear head over ``n_classes`` (chapter 15).

    ``forward(idx (B, T), labels (B,) = None, *, lengths (B,) = None)`` returns ``(logits (B,
    n_classes), loss or None)``. The GPT's last hidden states, after its final norm, are pooled
    over each row's first ``lengths`` positions (all ``T`` by default): their mean (``pool="mean"``)
    or the last one (``pool="last"``, the only position that has read the whole text).
    """

    def __init__(self, gpt: GPT, n_classes: int, pool: str = "mean"):
        super().__init__()
        if not isinstance(gpt, GPT):
            raise TypeError(f"gpt must be a GPT, got {type(gpt).__name__}")
        check_int(n_classes, "n_classes", minimum=2)
        if pool not in ("mean", "last"):
            raise ValueError(f"pool must be 'mean' or 'last', got {pool!r}")
        self.gpt, self.pool = gpt, pool
        param = next(gpt.parameters())
        self.head = nn.Linear(gpt.config.d_model, n_classes, device=param.device, dtype=param.dtype)
        nn.init.normal_(self.head.weight, std=0.02)
        nn.init.zeros_(self.head.bias)

    def forward(
        self, idx: Tensor, labels: Tensor | None = None, *, lengths: Tensor | None = None
    ) -> tuple[Tensor, Tensor | None]:
        """``idx (B, T)`` -> ``(logits (B, n_classes), loss)``; ``loss`` is the cross-entropy
        with ``labels (B,)`` when they are given."""
        h = self.gpt.hidden(idx)  # (B, T, d_model)
        B, T = idx.shape
        if lengths is None:
            lengths = torch.full((B,), T, device=idx.device)
        elif lengths.shape != (B,) or bool((lengths < 1).any()) or bool((lengths > T).any()):
            raise ValueError(f"lengths must be (B,) = ({B},) counts in [1, {T}], got {lengths.tolist()}")
        if self.pool == "last":
            features = h[torch.arange(B, device=h.device), lengths - 1]  # (B, d_model)
        else:
            real = (torch.arange(T, device=h.device) < lengths[:, None]).to(h.dtype)  # (B, T)
            features = (h * real[..., None]).sum(1) / lengths[:, None].to(h.dtype)  # (B, d_model)
        logits = self.head(features)  # (B, n_classes)
        loss = None
        if labels is not None:
            n = self.head.out_features
            if labels.shape != (B,) or bool((labels < 0).any()) or bool((labels >= n).any()):
                raise ValueError(f"labels must be (B,) = ({B},) classes in [0, {n}), got {labels.tolist()}")
            loss = F.cross_entropy(logits, labels)
        return logits, loss


def prepare_finetune(model: GPTClassifier, method: str, *, rank: int = 4, alpha: float = 8.0, seed: int = 0) -> int:
    """Choose what ``model`` trains (chapter 15) and return the number of trainable parameters:
    ``"head"`` the head only, ``"lora"`` adapters of :data:`LORA_TARGETS` of ``rank`` and
    ``alpha`` and the head, ``"full"`` every parameter."""
    if method not in FINETUNE_METHODS:
        raise ValueError(f"method must be one of {FINETUNE_METHODS}, got {method!r}")
    model.requires_grad_(method == "full")
    if method == "lora":
        add_lora(model.gpt, list(LORA_TARGETS), rank=rank, alpha=alpha, seed=seed)
    model.head.requires_grad_(True)
    return count_parameters(model)


class ClassBatches(_Batches):
    """Batches of a labelled task for :func:`~transformer_lib.train.train` (chapter 15).

    ``ClassBatches(train, val, batch_size)``, ``train`` and ``val`` each ``(ids (N, T), lengths
    (N,), labels (N,))``; ``batches(split)`` returns ``{"idx", "labels", "lengths"}``, the keyword
    arguments of :class:`GPTClassifier`, for ``batch_size`` random rows.
    """

    def __init__(self, train: Sequence[Tensor], val: Sequence[Tensor], batch_size: int, **sampling):
        super().__init__(batch_size, **sampling)
        self.data = {}
        for name, (ids, lengths, labels) in (("train", train), ("val", val)):
            if not len(ids) == len(lengths) == len(labels) > 0:
                raise ValueError(f"the {name} split's ids, lengths and labels must be as many, and some")
            self.data[name] = (ids, lengths, labels)

    def __call__(self, split: str = "train") -> dict[str, Tensor]:
        self._check_split(split)
        ids, lengths, labels = self.data[split]
        rows = self._rows(split, len(ids))
        return {"idx": ids[rows].to(self.device), "labels": labels[rows].to(self.device),
                "lengths": lengths[rows].to(self.device)}  # fmt: skip


@torch.no_grad()
def accuracy(model: GPTClassifier, ids: Tensor, lengths: Tensor, labels: Tensor, batch_size: int = 256) -> float:
    """The fraction of rows whose most likely class is the label (eval mode, restored after) (chapter 15)."""
    was = model.training
    model.eval()
    right = 0
    for i in range(0, len(ids), batch_size):
        logits, _ = model(ids[i : i + batch_size], lengths=lengths[i : i + batch_size])
        right += int((logits.argmax(-1) == labels[i : i + batch_size]).sum())
    model.train(was)
    return right / len(ids)


def wilson_interval(correct: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of an accuracy ``correct / n`` (95 % for ``z = 1.96``): the
    range of true accuracies that this count of right answers on ``n`` examples leaves plausible (chapter 15)."""
    check_int(n, "n")
    check_int(correct, "correct", minimum=0)
    if correct > n:
        raise ValueError(f"correct ({correct}) cannot exceed n ({n})")
    p = correct / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


@torch.no_grad()
def answers(model: GPT, tokenizer, prompts: Sequence[list[int]], max_new_tokens: int) -> list[tuple[list[int], bool]]:
    """Greedy answers of ``model`` to ``prompts`` (lists of ids): for each, ``(ids written before
    the end token, whether the end token came within max_new_tokens)`` (chapter 15). Prompts of one length
    are run as one batch."""
    eos = tokenizer.eos_id
    out: list = [None] * len(prompts)
    by_length: dict[int, list[int]] = {}
    for i, p in enumerate(prompts):
        by_length.setdefault(len(p), []).append(i)
    for rows in by_length.values():
        idx = torch.tensor([prompts[i] for i in rows], dtype=torch.long)
        new = model.generate(idx, max_new_tokens, top_k=1)[:, idx.shape[1] :].tolist()
        for i, ids in zip(rows, new, strict=True):
            stop = ids.index(eos) if eos in ids else None
            out[i] = (ids if stop is None else ids[:stop], stop is not None)
    return out
