"""The settings of a training run (chapter "A GPT from scratch"): :class:`TrainConfig`, the presets the command
line and the chapters start from, and the optimiser and learning-rate
schedule they define. Importing it imports no trainer and no command line.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

import torch
from torch import nn

from .recipe import FLAT_HELP as RECIPE_FLAT_HELP
from .recipe import LLAMA_BLOCK
from .utils import DTYPES, check_fields

__all__ = ["MODEL_SETTINGS", "PRESETS", "TrainConfig", "configure_optimizer", "lr_at", "make_scheduler"]


def _setting(default, help: str):  # noqa: A002 (the argparse word)
    """A :class:`TrainConfig` field whose help text the command line shows."""
    return field(default=default, metadata={"help": help})


@dataclass
class TrainConfig:
    """Settings of :func:`train` (chapter "A GPT from scratch"); the defaults are nanoGPT's CPU-sized run.

    Each setting is written here once: the command line's flags and presets
    (:mod:`transformer_lib.cli`) are made from these fields. ``batch_size`` is the number of
    sequences the command line samples per step; :func:`train` itself takes whatever
    ``get_batch`` returns.
    """

    batch_size: int = _setting(12, "sequences per step (per process under torchrun)")
    max_iters: int = _setting(2000, "optimizer steps in all")
    lr: float = _setting(1e-3, "peak learning rate, reached after the warm-up")
    min_lr: float = _setting(1e-4, "learning rate at the end of the cosine decay")
    warmup_iters: int = _setting(100, "steps of linear warm-up")
    lr_decay_iters: int | None = _setting(
        None, "step at which the cosine decay reaches min_lr (default: max_iters, the last step)"
    )
    weight_decay: float = _setting(0.1, "AdamW weight decay (matrices only)")
    beta1: float = _setting(0.9, "AdamW beta1")
    beta2: float = _setting(0.99, "AdamW beta2")
    grad_clip: float = _setting(1.0, "clip the global gradient norm to this (0: off)")
    eval_interval: int = _setting(250, "evaluate and save a checkpoint every this many steps (0: never)")
    eval_iters: int = _setting(20, "batches per split in each evaluation")
    log_interval: int = _setting(10, "read the loss from the device every this many steps")
    device: str | torch.device = _setting("auto", "'auto' (CUDA, then MPS, then CPU), 'cpu', 'cuda', 'cuda:1', ...")
    dtype: str = _setting(
        "auto", "autocast precision: auto (bfloat16 on GPUs that have it), float32, bfloat16, float16"
    )
    compile: bool = _setting(False, "torch.compile the model")
    out_dir: str | None = _setting(None, "folder for ckpt.pt (None: no checkpoints)")
    progress: bool = _setting(True, "show a progress bar")
    verbose: bool = _setting(True, "print a line per evaluation")
    peak_tflops: float | None = _setting(None, "the GPU's dense 16-bit peak for the MFU estimate (default: looked up)")

    def __post_init__(self) -> None:
        check_fields(self, _TRAIN_RULES)
        for name in ("compile", "progress", "verbose"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"TrainConfig.{name} must be True or False, got {getattr(self, name)!r}")
        if isinstance(self.dtype, str) and self.dtype != "auto" and self.dtype not in DTYPES:
            raise ValueError(f"TrainConfig.dtype must be 'auto' or one of {sorted(DTYPES)}, got {self.dtype!r}")
        if self.min_lr > self.lr:
            raise ValueError(f"TrainConfig.min_lr ({self.min_lr}) must not exceed lr ({self.lr})")
        if self.lr_decay_iters is not None and self.lr_decay_iters < self.warmup_iters:
            raise ValueError(
                f"TrainConfig.lr_decay_iters ({self.lr_decay_iters}) must not be below warmup_iters "
                f"({self.warmup_iters}): the decay would end before the warm-up does"
            )
        if self.out_dir is not None and not isinstance(self.out_dir, (str, os.PathLike)):
            raise TypeError(f"TrainConfig.out_dir must be a folder's path or None, got {self.out_dir!r}")
        if self.out_dir is not None and not str(self.out_dir).strip():
            raise ValueError(
                f"TrainConfig.out_dir is empty ({self.out_dir!r}): give a folder for the checkpoints, or None for none"
            )


_TRAIN_RULES = {
    "batch_size": (int, "positive"),
    "max_iters": (int, "count"),
    "lr": (float, "positive"),
    "min_lr": (float, "count"),
    "warmup_iters": (int, "count"),
    "lr_decay_iters": (int, "count"),
    "weight_decay": (float, "count"),
    "beta1": (float, "probability"),
    "beta2": (float, "probability"),
    "grad_clip": (float, "count"),
    "eval_interval": (int, "count"),
    "eval_iters": (int, "positive"),
    "log_interval": (int, "positive"),
    "peak_tflops": (float, "positive"),
}


MODEL_SETTINGS = {
    "n_layers": "transformer blocks",
    "n_heads": "attention heads per block",
    "d_model": "width of the residual stream",
    "context_len": "context length T in tokens (characters, or BPE tokens with --tokenizer bpe)",
    "dropout": "dropout probability",
    "n_kv_heads": "key/value heads, grouped-query attention (default: n_heads)",
    "window": "sliding-window attention: each token sees itself and the window - 1 before it (default: none)",
    # chapter "Today's block" and after: the recipe's choices by their flat names, each kind's options
    # with the help its spec's fields give (transformer_lib.recipe)
    **RECIPE_FLAT_HELP,
}

# nanoGPT's character-level Shakespeare shapes: a "baby" GPT for a CPU (the defaults of GPTConfig
# and TrainConfig) and a bigger one for a GPU. Each preset: (GPTConfig changes, TrainConfig).
PRESETS: dict[str, tuple[dict, TrainConfig]] = {
    "cpu": ({}, TrainConfig()),
    # chapter "Today's block": the CPU preset's size with Llama's block (RMSNorm, SwiGLU, rotary positions, no biases)
    "llama-cpu": (LLAMA_BLOCK.changes(), TrainConfig()),
    "gpu": (
        dict(n_layers=6, n_heads=6, d_model=384, context_len=256, dropout=0.2),
        TrainConfig(batch_size=64, max_iters=5000, eval_iters=200),
    ),
}


def configure_optimizer(model: nn.Module, config: TrainConfig, device: torch.device | None = None):
    """AdamW with weight decay on the matrices (embeddings, linear weights) and none on biases and
    LayerNorm parameters; the fused CUDA kernel on a GPU (chapter "A GPT from scratch")."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": config.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    fused = True if device is not None and torch.device(device).type == "cuda" else None
    return torch.optim.AdamW(groups, lr=config.lr, betas=(config.beta1, config.beta2), fused=fused)


def lr_at(step: int, config: TrainConfig) -> float:
    """The learning rate of step ``step`` (0-based, chapter "A GPT from scratch"): linear warm-up to ``lr``, then a
    cosine decay to ``min_lr`` at ``lr_decay_iters``, then constant."""
    if step < config.warmup_iters:
        return config.lr * (step + 1) / config.warmup_iters
    decay_iters = config.max_iters if config.lr_decay_iters is None else config.lr_decay_iters
    if step >= decay_iters:
        return config.min_lr
    progress = (step - config.warmup_iters) / max(1, decay_iters - config.warmup_iters)  # 0 -> 1
    return config.min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (config.lr - config.min_lr)


def make_scheduler(optimizer: torch.optim.Optimizer, config: TrainConfig) -> torch.optim.lr_scheduler.LambdaLR:
    """A ``LambdaLR`` that sets every group's learning rate to :func:`lr_at` at each step (chapter "A GPT from
    scratch")."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_at(step, config) / config.lr)
