"""Fine-tuning a pretrained GPT (chapter "Fine-tuning"): a classification head on its
features, the choice of what to train (the head, low-rank adapters, or everything), the
batches of a labelled task for :func:`~transformer_lib.train.train`, and the measures the
chapter reports: accuracy with its interval, and answers generated up to the end token.

The training loop is :func:`~transformer_lib.train.train`, unchanged: a
:class:`GPTClassifier` returns ``(logits, loss)`` like every model the loop trains, and
:class:`ClassBatches` returns its keyword arguments.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from ._checks import check_int
from .data.batches import _Batches
from .data.instructions import InstructionBatches, encode_pair
from .data.speeches import encode_texts
from .lora import add_lora, count_parameters
from .models import GPT
from .parts import part_weights
from .train import train
from .train_config import TrainConfig

__all__ = [
    "FINETUNE_METHODS",
    "LORA_ROLES",
    "LORA_TARGETS",
    "PRETRAINED_PATH",
    "ClassBatches",
    "GPTClassifier",
    "accuracy",
    "CLASSIFIER_LR",
    "INSTRUCTION_VARIANTS",
    "answers",
    "classifier_run",
    "instruction_run",
    "lora_targets",
    "prepare_finetune",
    "short_run_config",
    "window_loss",
    "wilson_interval",
]

#: Chapter "Fine-tuning"'s pretrained GPT (``scripts/pretrain_ch15.py``: the training command on the first 90 %
#: of Tiny Shakespeare, BPE tokens), shipped with the package; ``pretrained.json`` beside it
#: records how it was made and its validation loss.
PRETRAINED_PATH = Path(__file__).parent / "data" / "ch15" / "pretrained.pt"

#: What each method trains: the head only, low-rank adapters and the head, or every weight.
FINETUNE_METHODS = ("head", "lora", "full")

#: The roles whose matrices chapter "Fine-tuning" adapts with LoRA: every matrix of every block's attention and
#: feed-forward network (:mod:`transformer_lib.parts`), whatever the block's recipe.
LORA_ROLES = ("attention", "feed_forward")
#: The same weights as name patterns, for GPT-2's block only (chapter "Fine-tuning"'s first examples; kept as an
#: alias: :func:`lora_targets` finds them in any block).
LORA_TARGETS = ("*.self_attn.in_proj_weight", "*.self_attn.out_proj.weight", "*.ff.net.*.weight")


def lora_targets(model: nn.Module, roles: tuple[str, ...] = LORA_ROLES) -> list[str]:
    """The names of the matrices LoRA adapts in ``model`` (chapter "Fine-tuning"): those of its parts with
    ``roles`` (default :data:`LORA_ROLES`), for GPT-2's block, Llama's and any other recipe's.
    Refused by name when the model has none."""
    names = part_weights(model, roles)
    if not names:
        raise ValueError(f"{type(model).__name__} has no part with the roles {roles}: nothing for LoRA to adapt")
    return names


class GPTClassifier(nn.Module):
    """A :class:`~transformer_lib.models.GPT` read by a linear head over ``n_classes`` (chapter "Fine-tuning").

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
        _int_tensors(lengths=lengths, labels=labels)
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
    """Choose what ``model`` trains (chapter "Fine-tuning") and return the number of trainable parameters:
    ``"head"`` the head only, ``"lora"`` adapters of :func:`lora_targets` of ``rank`` and
    ``alpha`` and the head, ``"full"`` every parameter."""
    if method not in FINETUNE_METHODS:
        raise ValueError(f"method must be one of {FINETUNE_METHODS}, got {method!r}")
    model.requires_grad_(method == "full")
    if method == "lora":
        add_lora(model.gpt, lora_targets(model.gpt), rank=rank, alpha=alpha, seed=seed)
    model.head.requires_grad_(True)
    return count_parameters(model)


def _int_tensors(**named) -> None:
    """Each value that is not None must be a tensor of integers (counts, classes)."""
    for name, t in named.items():
        if t is not None and not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a tensor of ints, got a {type(t).__name__}: use torch.tensor({name})")
        if t is not None and (t.is_floating_point() or t.is_complex() or t.dtype == torch.bool):
            raise TypeError(f"{name} must be a tensor of ints, got dtype {t.dtype}")


def _rows(what: str, ids, lengths, labels) -> int:
    """The number of rows of ``ids (N, T)``, ``lengths (N,)`` and ``labels (N,)``, which must agree and be some."""
    if not isinstance(ids, Tensor) or ids.dim() != 2:
        shape = tuple(ids.shape) if isinstance(ids, Tensor) else type(ids).__name__
        raise TypeError(f"{what}: ids must be a tensor (N, T), got {shape}")
    _int_tensors(lengths=lengths, labels=labels)
    counts = {"ids": len(ids), "lengths": len(lengths), "labels": len(labels)}
    if len(set(counts.values())) > 1:
        raise ValueError(f"{what}: ids, lengths and labels must have one row each per example, got {counts}")
    if not len(ids):
        raise ValueError(f"{what} holds no rows (N = 0)")
    return len(ids)


class ClassBatches(_Batches):
    """Batches of a labelled task for :func:`~transformer_lib.train.train` (chapter "Fine-tuning").

    ``ClassBatches(train, val, batch_size)``, ``train`` and ``val`` each ``(ids (N, T), lengths
    (N,), labels (N,))``; ``batches(split)`` returns ``{"idx", "labels", "lengths"}``, the keyword
    arguments of :class:`GPTClassifier`, for ``batch_size`` random rows.
    """

    def __init__(self, train: Sequence[Tensor], val: Sequence[Tensor], batch_size: int, **sampling):
        super().__init__(batch_size, **sampling)
        self.data = {}
        for name, split in (("train", train), ("val", val)):
            if isinstance(split, (str, dict)) or not isinstance(split, Sequence) or len(split) != 3:
                raise TypeError(f"the {name} split must be (ids, lengths, labels), got a {type(split).__name__}")
            _rows(f"the {name} split", *split)
            self.data[name] = tuple(split)

    def __call__(self, split: str = "train") -> dict[str, Tensor]:
        self._check_split(split)
        ids, lengths, labels = self.data[split]
        rows = self._rows(split, len(ids))
        return {
            "idx": ids[rows].to(self.device),
            "labels": labels[rows].to(self.device),
            "lengths": lengths[rows].to(self.device),
        }


@torch.no_grad()
def accuracy(model: GPTClassifier, ids: Tensor, lengths: Tensor, labels: Tensor, batch_size: int = 256) -> float:
    """The fraction of rows whose most likely class is the label (eval mode, restored after) (chapter "Fine-tuning").
    ``ids (N, T)``, ``lengths (N,)`` and ``labels (N,)`` tensors, ``N >= 1``, labels in ``[0, n_classes)``."""
    _rows("accuracy", ids, lengths, labels)
    n = model.head.out_features
    if bool((labels < 0).any()) or bool((labels >= n).any()):
        raise ValueError(f"labels must be classes in [0, {n}), got {sorted(set(labels.tolist()) - set(range(n)))}")
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
    range of true accuracies that this count of right answers on ``n`` examples leaves plausible (chapter
    "Fine-tuning")."""
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
    the end token, whether the end token came within max_new_tokens)`` (chapter "Fine-tuning"). Prompts of one length
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


#: Chapter "Fine-tuning"'s settings for each way of training a classifier: learning rate (peak of a short
#: warm-up and a cosine decay to a tenth of it). ``"scratch"`` trains every weight of a new model.
CLASSIFIER_LR = {"head": 3e-3, "lora": 3e-3, "full": 5e-4, "scratch": 1e-3}

#: The instruction-tuning variants of chapter "Fine-tuning": the right recipe and one mistake each.
INSTRUCTION_VARIANTS = {
    "right": dict(mask_prompt=True, mask_padding=True, end=True),
    "prompt in the loss": dict(mask_prompt=False, mask_padding=True, end=True),
    "padding in the loss": dict(mask_prompt=True, mask_padding=False, end=True),
    "no end token": dict(mask_prompt=True, mask_padding=True, end=False),
}


def window_loss(model: GPT, tokens: Tensor, *, batches: int = 20, batch_size: int = 32, seed: int = 0) -> float:
    """The mean next-token loss of ``model`` on ``batches`` batches of random windows of ``tokens``
    (drawn with ``seed``, so two models are measured on the same windows): chapter "Fine-tuning" measures
    what fine-tuning costs the language model with it. ``tokens (N,)`` needs ``N >= context_len + 1``."""
    T = model.config.context_len
    check_int(batches, "batches")
    check_int(batch_size, "batch_size")
    _int_tensors(tokens=tokens)
    if tokens.dim() != 1 or len(tokens) < T + 1:
        raise ValueError(
            f"tokens must be a stream (N,) of at least context_len + 1 = {T + 1} tokens (a window and "
            f"its next token), got shape {tuple(tokens.shape)}"
        )
    g = torch.Generator().manual_seed(seed)
    was, total = model.training, 0.0
    model.eval()
    with torch.no_grad():
        for _ in range(batches):
            starts = torch.randint(len(tokens) - T, (batch_size,), generator=g)
            rows = torch.stack([tokens[s : s + T + 1] for s in starts.tolist()])
            total += model(rows[:, :-1], rows[:, 1:])[1].item()
    model.train(was)
    return total / batches


def short_run_config(steps: int, lr: float, batch_size: int) -> TrainConfig:
    """Chapter "Fine-tuning"'s short runs: a warm-up, a cosine decay to a tenth of ``lr``, no weight decay or
    evaluation."""
    return TrainConfig(
        batch_size=batch_size,
        max_iters=steps,
        lr=lr,
        min_lr=lr / 10,
        warmup_iters=min(20, steps),
        weight_decay=0.0,
        eval_interval=0,
        device="cpu",
        progress=False,
        verbose=False,
    )


def classifier_run(
    base: GPT,
    tokenizer,
    task,
    method: str,
    seed: int,
    *,
    steps: int = 150,
    batch_size: int = 16,
    rank: int = 4,
    dtype: torch.dtype = torch.float32,
) -> dict:
    """Train a :class:`GPTClassifier` on ``task`` (a :class:`~transformer_lib.data.LabelledTexts`)
    by ``method`` (one of :data:`FINETUNE_METHODS`, or ``"scratch"``: every weight of a new GPT of
    ``base``'s shape) for ``steps`` steps with ``seed``, and score it on the test split (chapter "Fine-tuning").
    ``base`` is left as it was. Returns ``{"accuracy", "correct", "n", "trainable", "seconds",
    "model"}``."""
    if len(task.classes) < 2:
        raise ValueError(
            f"the task has {len(task.classes)} class{'es' * (len(task.classes) != 1)} ({task.classes}): "
            f"a classifier needs at least 2"
        )
    for part in ("train", "test"):
        if not getattr(task, part):
            raise ValueError(f"the task's {part} split holds no text")
    seen = sorted(set(task.split("train")[1]))
    if len(seen) < 2:  # one label: the head learns to say it, and the accuracy is its share of the test split
        raise ValueError(
            f"the task's train split holds only the class {[task.classes[i] for i in seen]}: "
            "a classifier needs examples of at least 2 classes to learn anything"
        )
    torch.manual_seed(seed)
    gpt = GPT(base.config) if method == "scratch" else copy.deepcopy(base)
    model = GPTClassifier(gpt.to(dtype), len(task.classes)).train()
    trainable = prepare_finetune(
        model, "full" if method == "scratch" else method, rank=rank, alpha=2.0 * rank, seed=seed
    )
    T, pad = base.config.context_len, tokenizer.eos_id
    split = {}
    for part in ("train", "test"):
        texts, labels = task.split(part)
        split[part] = (*encode_texts(tokenizer, texts, T, pad), torch.tensor(labels))
    start = time.perf_counter()
    train(
        model,
        ClassBatches(split["train"], split["test"], batch_size, seed=seed),
        short_run_config(steps, CLASSIFIER_LR[method], batch_size),
    )
    seconds = time.perf_counter() - start
    correct = round(accuracy(model, *split["test"]) * len(split["test"][0]))
    n = len(split["test"][0])
    return {
        "accuracy": correct / n,
        "correct": correct,
        "n": n,
        "trainable": trainable,
        "seconds": seconds,
        "model": model,
    }


def instruction_run(
    base: GPT,
    tokenizer,
    train_pairs,
    test_pairs,
    variant: str,
    seed: int,
    *,
    steps: int = 300,
    batch_size: int = 16,
    lr: float = 1e-3,
    lora_rank: int | None = None,
    max_new_tokens: int = 16,
    dtype: torch.dtype = torch.float32,
) -> dict:
    """Fine-tune a copy of ``base`` on prompt/response pairs the way ``variant`` (a key of
    :data:`INSTRUCTION_VARIANTS`) says, every weight or (``lora_rank``) adapters only, and answer
    ``test_pairs``' prompts greedily (chapter "Fine-tuning"). Returns ``{"exact_match"`` (the answer before the
    end token equals the response, and the end token came), ``"correct_start"`` (the answer
    starts with the response), ``"stopped"`` (the end token came within ``max_new_tokens``),
    ``"model"}``."""
    if variant not in INSTRUCTION_VARIANTS:
        raise ValueError(f"variant must be one of {list(INSTRUCTION_VARIANTS)}, got {variant!r}")
    how = INSTRUCTION_VARIANTS[variant]
    torch.manual_seed(seed)
    model = copy.deepcopy(base).to(dtype).train()
    if lora_rank is not None:
        add_lora(model, lora_targets(model), rank=lora_rank, alpha=2.0 * lora_rank, seed=seed)
    rows = [encode_pair(tokenizer, p, r, end=how["end"]) for p, r in train_pairs]
    masks = {k: how[k] for k in ("mask_prompt", "mask_padding")}
    batches = InstructionBatches(
        rows, rows[:batch_size], base.config.context_len, batch_size, tokenizer.eos_id, seed=seed, **masks
    )
    train(model, batches, short_run_config(steps, lr, batch_size))
    model.eval()
    prompts = []
    for p, r in test_pairs:
        ids, n_prompt = encode_pair(tokenizer, p, r, end=False)
        prompts.append(ids[:n_prompt])
    got = answers(model, tokenizer, prompts, max_new_tokens)
    texts = [tokenizer.decode(ids) for ids, _ in got]
    want = [r for _, r in test_pairs]
    n = len(test_pairs)
    return {
        "exact_match": sum(t == w and s for t, w, (_, s) in zip(texts, want, got, strict=True)) / n,
        "correct_start": sum(t.startswith(w) for t, w in zip(texts, want, strict=True)) / n,
        "stopped": sum(s for _, s in got) / n,
        "answers": texts[:5],
        "model": model,
    }
