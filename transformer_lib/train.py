"""Training (chapter 9, "A GPT from scratch"; used for the encoder-decoder of chapter 8 too).

:func:`train` runs AdamW (weight decay on matrices only) with a linear warm-up and a cosine
learning-rate decay, gradient clipping, periodic evaluation, a progress bar, mixed precision and
TF32 on GPUs, optional ``torch.compile``, and checkpoints that resume exactly. It trains any
model whose ``forward(*batch)`` returns ``(logits, loss)``: a :class:`~transformer_lib.models.GPT`
with ``(x, y)`` batches, a :class:`~transformer_lib.models.Transformer` with
``(src, tgt_in, tgt_out)`` batches. Inside a step nothing waits for the GPU: the loss stays a
tensor and is read (``.item()``) only every ``log_interval`` steps.

The command line trains a character-level GPT on Tiny Shakespeare and samples from it::

    python -m transformer_lib.train --preset cpu            # or: transformer-train --preset cpu
    python -m transformer_lib.train --resume                # continue from out/ckpt.pt
    python -m transformer_lib.train sample --ckpt out --prompt "ROMEO:"

Data-parallel training: when ``torch.distributed`` is initialised (for example under
``torchrun --nproc_per_node=2 -m transformer_lib.train``), :func:`train` wraps the model in
``DistributedDataParallel``, averages evaluation losses over the ranks, and only rank 0 shows
progress and writes checkpoints; each rank draws its slice of the global batch
(:class:`~transformer_lib.data.LMBatches` with ``rank`` and ``world_size``).
"""

from __future__ import annotations

import argparse
import math
import os
import random
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn
from tqdm import tqdm

from .data import CharTokenizer, LMBatches, load_corpus, split_tokens
from .models import GPT, GPTConfig, Transformer, TransformerConfig
from .utils import pick_device, set_seed

__all__ = [
    "PEAK_FLOPS",
    "PRESETS",
    "History",
    "TrainConfig",
    "configure_optimizer",
    "estimate_loss",
    "estimate_mfu",
    "exact_match",
    "flops_per_token",
    "gpu_peak_flops",
    "load_checkpoint",
    "lr_at",
    "main",
    "make_scheduler",
    "save_checkpoint",
    "train",
]

CHECKPOINT_NAME = "ckpt.pt"


@dataclass
class TrainConfig:
    """Settings of :func:`train` (chapter 9); the defaults are nanoGPT's CPU-sized run."""

    max_iters: int = 2000
    lr: float = 1e-3  # peak learning rate, reached after the warm-up
    min_lr: float = 1e-4  # the learning rate at the end of the cosine decay
    warmup_iters: int = 100
    lr_decay_iters: int | None = None  # None: max_iters
    weight_decay: float = 0.1  # on matrices (dim >= 2) only
    beta1: float = 0.9
    beta2: float = 0.99
    grad_clip: float = 1.0  # max global gradient norm; 0 disables clipping
    eval_interval: int = 250  # evaluate (and save a checkpoint) every this many steps; 0: never
    eval_iters: int = 20  # batches per split in each evaluation
    log_interval: int = 10  # read the loss from the device every this many steps
    device: str = "auto"  # "auto": CUDA, then Apple MPS, then the CPU
    dtype: str = "auto"  # "auto" (bfloat16 on GPUs that have it), "float32", "bfloat16" or "float16"
    compile: bool = False  # torch.compile the model
    out_dir: str | None = None  # where ckpt.pt is written; None: no checkpoints
    progress: bool = True  # show a tqdm progress bar
    verbose: bool = True  # print a line per evaluation
    peak_tflops: float | None = None  # the GPU's dense 16-bit peak for the MFU estimate; None: look it up


@dataclass
class History:
    """What :func:`train` returns (chapter 9): the loss of every step and the evaluations.

    ``step_loss[i]`` and ``lr[i]`` belong to step ``i + 1``; ``train_loss[j]`` and ``val_loss[j]``
    are the mean losses on ``eval_iters`` batches after ``eval_step[j]`` steps. ``mfu`` is the last
    model-FLOPs-utilisation estimate (CUDA only).
    """

    step_loss: list[float] = field(default_factory=list)
    lr: list[float] = field(default_factory=list)
    eval_step: list[int] = field(default_factory=list)
    train_loss: list[float] = field(default_factory=list)
    val_loss: list[float] = field(default_factory=list)
    mfu: float | None = None


# ---------------------------------------------------------------------------------------------
# Optimiser and learning-rate schedule
# ---------------------------------------------------------------------------------------------


def configure_optimizer(model: nn.Module, config: TrainConfig, device: torch.device | None = None):
    """AdamW with weight decay on the matrices (embeddings, linear weights) and none on biases and
    LayerNorm parameters; the fused CUDA kernel on a GPU."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": config.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    fused = True if device is not None and torch.device(device).type == "cuda" else None
    return torch.optim.AdamW(groups, lr=config.lr, betas=(config.beta1, config.beta2), fused=fused)


def lr_at(step: int, config: TrainConfig) -> float:
    """The learning rate of step ``step`` (0-based): linear warm-up to ``lr``, then a cosine
    decay to ``min_lr`` at ``lr_decay_iters``, then constant."""
    if step < config.warmup_iters:
        return config.lr * (step + 1) / config.warmup_iters
    decay_iters = config.max_iters if config.lr_decay_iters is None else config.lr_decay_iters
    if step >= decay_iters:
        return config.min_lr
    progress = (step - config.warmup_iters) / max(1, decay_iters - config.warmup_iters)  # 0 -> 1
    return config.min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (config.lr - config.min_lr)


def make_scheduler(optimizer: torch.optim.Optimizer, config: TrainConfig) -> torch.optim.lr_scheduler.LambdaLR:
    """A ``LambdaLR`` that sets every group's learning rate to :func:`lr_at` at each step."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_at(step, config) / config.lr)


# ---------------------------------------------------------------------------------------------
# Evaluation and throughput
# ---------------------------------------------------------------------------------------------


def _autocast(device: torch.device, dtype: torch.dtype):
    if dtype == torch.float32:
        return nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def _resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        if device.type != "cuda":
            return torch.float32
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if name not in dtypes:
        raise ValueError(f"dtype must be 'auto' or one of {sorted(dtypes)}, got {name!r}")
    return dtypes[name]


def _on(batch: Sequence[Tensor], device: torch.device) -> tuple[Tensor, ...]:
    return tuple(t.to(device, non_blocking=True) for t in batch)


@torch.no_grad()
def estimate_loss(
    model: nn.Module, get_batch: Callable[[str], Sequence[Tensor]], eval_iters: int = 20, dtype: str = "auto"
) -> dict[str, float]:
    """Mean loss over ``eval_iters`` batches of each split, ``{"train": ..., "val": ...}`` (chapter 9).

    The model is put in eval mode (no dropout) and back in its previous mode afterwards. Under
    ``torch.distributed`` the means are averaged over the ranks.
    """
    device = next(model.parameters()).device
    autocast_dtype = _resolve_dtype(dtype, device)
    was_training = model.training
    model.eval()
    out = {}
    for split in ("train", "val"):
        losses = torch.zeros(eval_iters, device=device)
        for k in range(eval_iters):
            with _autocast(device, autocast_dtype):
                _, loss = model(*_on(get_batch(split), device))
            losses[k] = loss.float()
        mean = losses.mean()
        if _world()[1] > 1:
            dist.all_reduce(mean)
            mean /= _world()[1]
        out[split] = mean.item()
    model.train(was_training)
    return out


@torch.no_grad()
def exact_match(model: Transformer, src: Tensor, tgt: Tensor, batch_size: int = 500) -> float:
    """Fraction of rows that greedy decoding gets exactly right (chapter 8).

    ``src (N, T_src)`` and ``tgt (N, T_tgt)`` laid out as in :mod:`transformer_lib.data`: a row is
    right when the decoded tokens equal ``tgt[:, 1:]`` (the answer, ``eos``, then padding).
    """
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    correct = 0
    for i in range(0, len(src), batch_size):
        s, t = src[i : i + batch_size].to(device), tgt[i : i + batch_size, 1:].to(device)  # (b, T_src), (b, T)
        pred = model.greedy_decode(s, max_new_tokens=t.shape[1])  # (b, <= T)
        pred = F.pad(pred, (0, t.shape[1] - pred.shape[1]), value=model.config.pad_id)  # (b, T)
        correct += int((pred == t).all(dim=1).sum())
    model.train(was_training)
    return correct / max(1, len(src))


# Dense (no sparsity) 16-bit tensor-core peaks, FLOP/s; bfloat16 where the GPU has it. The first
# name contained in torch.cuda.get_device_name() wins, so the more specific names come first.
PEAK_FLOPS: dict[str, float] = {
    "H100 PCIe": 756e12,
    "H100": 989.4e12,
    "H200": 989.4e12,
    "A100": 312e12,
    "L40S": 362e12,
    "L4": 121e12,
    "A10": 125e12,
    "V100": 125e12,  # float16
    "T4": 65e12,  # float16
}


def gpu_peak_flops(name: str | None = None) -> float | None:
    """The dense 16-bit peak of the GPU called ``name`` (default: the current one), or None if unknown."""
    if name is None:
        if not torch.cuda.is_available():
            return None
        name = torch.cuda.get_device_name()
    return next((flops for key, flops in PEAK_FLOPS.items() if key in name), None)


def flops_per_token(model: GPT, T: int) -> float:
    """Training FLOPs per token of a GPT with context ``T``: ``6 N + 12 L h d_k T`` (chapter 9).

    ``6 N`` counts the forward (2) and backward (4) multiply-adds of the ``N`` parameters (without
    the position embeddings, :meth:`GPT.num_params`); ``12 L h d_k T`` those of the attention
    scores and weighted sums, which have no parameters.
    """
    c = model.config
    return 6 * model.num_params() + 12 * c.n_layers * c.d_model * T  # h * d_k = d_model


def estimate_mfu(model: GPT, tokens_per_second: float, T: int, peak_flops: float) -> float:
    """Model FLOPs utilisation: the FLOP/s training achieves over the hardware's peak."""
    return flops_per_token(model, T) * tokens_per_second / peak_flops


# ---------------------------------------------------------------------------------------------
# Checkpoints
# ---------------------------------------------------------------------------------------------


def save_checkpoint(state: dict, path: str | os.PathLike) -> Path:
    """``torch.save`` to a temporary file beside ``path``, then rename it: a reader (or a crash)
    never sees a half-written checkpoint."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    os.close(fd)
    try:
        torch.save(state, tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _checkpoint_file(path: str | os.PathLike) -> Path:
    path = Path(path)
    return path / CHECKPOINT_NAME if path.is_dir() else path


_MODELS = {"GPT": (GPT, GPTConfig), "Transformer": (Transformer, TransformerConfig)}


def load_checkpoint(
    path: str | os.PathLike, device: torch.device | str = "cpu"
) -> tuple[nn.Module, CharTokenizer | None, dict]:
    """Rebuild the model saved by :func:`train` in ``path`` (a ``ckpt.pt`` or its folder).

    Returns ``(model, tokenizer or None, checkpoint dict)``; the model is on ``device`` in eval mode.
    """
    file = _checkpoint_file(path)
    if not file.is_file():
        raise FileNotFoundError(f"no checkpoint at {file}")
    ckpt = torch.load(file, map_location="cpu", weights_only=True)
    model_cls, config_cls = _MODELS[ckpt["model_class"]]
    model = model_cls(config_cls(**ckpt["model_config"]))
    model.load_state_dict(ckpt["model"])
    tokenizer = CharTokenizer.from_dict(ckpt["tokenizer"]) if ckpt.get("tokenizer") else None
    return model.to(device).eval(), tokenizer, ckpt


def _capture_rng(get_batch) -> dict:
    """Every random state a training step reads (cheap: a few small copies)."""
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),  # noqa: NPY002 (the legacy global generator)
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else [],
        "batches": get_batch.state_dict() if hasattr(get_batch, "state_dict") else None,
    }


def _rng_for_saving(rng: dict) -> dict:
    name, keys, pos, has_gauss, cached = rng["numpy"]
    return {**rng, "numpy": [name, keys.tolist(), pos, has_gauss, cached]}  # plain types: weights_only loads it


def _restore_rng(rng: dict, get_batch) -> None:
    random.setstate(rng["python"])
    name, keys, pos, has_gauss, cached = rng["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))  # noqa: NPY002
    torch.set_rng_state(rng["torch"])
    if rng["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])
    if rng["batches"] is not None and hasattr(get_batch, "load_state_dict"):
        get_batch.load_state_dict(rng["batches"])


# ---------------------------------------------------------------------------------------------
# The training loop
# ---------------------------------------------------------------------------------------------


def _world() -> tuple[int, int]:
    """``(rank, world_size)`` of this process; ``(0, 1)`` without ``torch.distributed``."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def train(
    model: nn.Module,
    get_batch: Callable[[str], Sequence[Tensor]],
    config: TrainConfig | None = None,
    *,
    tokenizer: CharTokenizer | None = None,
    meta: dict | None = None,
    resume: bool = False,
    until: int | None = None,
) -> History:
    """Train ``model`` on batches from ``get_batch(split)`` (chapter 9); returns the :class:`History`.

    ``get_batch("train")`` / ``get_batch("val")`` return the arguments of ``model(*batch)``, which
    must return ``(logits, loss)``: :class:`~transformer_lib.data.LMBatches` for a GPT,
    :class:`~transformer_lib.data.Seq2SeqBatches` for a Transformer. The model is moved to the
    chosen device. With ``config.out_dir`` a checkpoint (model, optimiser, scheduler, step,
    configs, ``tokenizer``, ``meta``, every random state and the batch sampler's state) is written
    after each evaluation, at the end, and on Ctrl-C before the ``KeyboardInterrupt`` propagates.
    ``resume=True`` continues from that checkpoint exactly: the same steps, batches and random
    numbers as a run that never stopped. ``until`` stops early after that many steps (of
    ``config.max_iters``, whose schedule is kept), as if interrupted.
    """
    config = config or TrainConfig()
    rank, world_size = _world()
    is_main = rank == 0
    device = pick_device(config.device)
    dtype = _resolve_dtype(config.dtype, device)
    if device.type == "cuda":
        torch.set_float32_matmul_precision("high")  # TF32 matmuls for what autocast leaves in float32
    model.to(device)
    optimizer = configure_optimizer(model, config, device)
    scheduler = make_scheduler(optimizer, config)
    scaler = torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)  # float16 needs loss scaling
    ckpt_path = Path(config.out_dir) / CHECKPOINT_NAME if config.out_dir else None
    history, step, eval_pending = History(), 0, True  # eval_pending: step `step` is not evaluated yet
    if resume:
        if ckpt_path is None or not ckpt_path.is_file():
            raise FileNotFoundError(f"resume=True but there is no checkpoint at {ckpt_path} (config.out_dir)")
        ckpt = torch.load(ckpt_path, map_location="cpu", weights_only=True)
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        scheduler.load_state_dict(ckpt["scheduler"])
        scaler.load_state_dict(ckpt["scaler"])
        step, eval_pending, history = ckpt["step"], ckpt["eval_pending"], History(**ckpt["history"])
        _restore_rng(ckpt["rng"], get_batch)

    step_model = torch.compile(model) if config.compile else model
    if world_size > 1:
        device_ids = [device.index] if device.type == "cuda" else None
        step_model = nn.parallel.DistributedDataParallel(step_model, device_ids=device_ids)
    until = config.max_iters if until is None else min(until, config.max_iters)
    peak = config.peak_tflops * 1e12 if config.peak_tflops else gpu_peak_flops() if device.type == "cuda" else None
    snapshot = _capture_rng(get_batch)  # the random states as of the last completed step or evaluation

    saved_step = None

    def checkpoint() -> None:
        nonlocal saved_step
        if ckpt_path is None or not is_main or saved_step == (step, eval_pending):
            return
        save_checkpoint(
            {
                "model_class": type(model).__name__,
                "model_config": asdict(model.config) if hasattr(model, "config") else None,
                "train_config": asdict(config),
                "step": step,
                "eval_pending": eval_pending,
                "model": model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(),
                "scaler": scaler.state_dict(),
                "tokenizer": tokenizer.to_dict() if tokenizer is not None else None,
                "rng": _rng_for_saving(snapshot),
                "history": asdict(history),
                "meta": meta or {},
            },
            ckpt_path,
        )
        saved_step = (step, eval_pending)

    pending: list[Tensor] = []  # losses still on the device

    def read_losses() -> None:  # the only host-device synchronisation of the loop
        if pending:
            history.step_loss.extend(torch.stack(pending).float().tolist())
            pending.clear()

    bar = tqdm(total=config.max_iters, initial=step, desc="training", disable=not (config.progress and is_main))
    timer, timer_step = time.perf_counter(), step
    model.train()
    try:
        while True:
            due = config.eval_interval > 0 and (step % config.eval_interval == 0 or step == config.max_iters)
            if eval_pending and due:
                losses = estimate_loss(model, get_batch, config.eval_iters, config.dtype)
                history.eval_step.append(step)
                history.train_loss.append(losses["train"])
                history.val_loss.append(losses["val"])
                eval_pending, snapshot = False, _capture_rng(get_batch)
                if config.verbose and is_main:
                    bar.write(f"step {step}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
                if step > 0:
                    read_losses()
                    checkpoint()
                timer, timer_step = time.perf_counter(), step
            if step >= until:
                break

            batch = _on(get_batch("train"), device)
            with _autocast(device, dtype):
                _, loss = step_model(*batch)
            scaler.scale(loss).backward()
            if config.grad_clip > 0:
                scaler.unscale_(optimizer)
                nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            history.lr.append(scheduler.get_last_lr()[0])
            scheduler.step()
            pending.append(loss.detach())
            step, eval_pending, snapshot = step + 1, True, _capture_rng(get_batch)
            bar.update(1)

            if step % config.log_interval == 0 or step == until:
                read_losses()
                now = time.perf_counter()
                postfix = {"loss": f"{history.step_loss[-1]:.4f}", "lr": f"{history.lr[-1]:.2e}"}
                if peak and isinstance(model, GPT) and step > timer_step:
                    tokens_per_second = batch[0].numel() * (step - timer_step) / (now - timer)
                    history.mfu = estimate_mfu(model, tokens_per_second, batch[0].shape[1], peak)
                    postfix["mfu"] = f"{100 * history.mfu:.1f}%"
                bar.set_postfix(postfix, refresh=False)
                timer, timer_step = now, step
    except KeyboardInterrupt:
        read_losses()
        checkpoint()
        if ckpt_path is not None and is_main:
            bar.write(f"interrupted after {step} steps; checkpoint saved to {ckpt_path}")
        raise
    finally:
        bar.close()
    read_losses()
    checkpoint()
    return history


# ---------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------

# nanoGPT's character-level Shakespeare shapes: a "baby" GPT for a CPU and a bigger one for a GPU.
PRESETS: dict[str, dict] = {
    "cpu": dict(
        n_layers=4, n_heads=4, d_model=128, block_size=64, dropout=0.0, batch_size=12, max_iters=2000,
        lr=1e-3, min_lr=1e-4, warmup_iters=100, lr_decay_iters=2000, weight_decay=0.1, beta1=0.9, beta2=0.99,
        grad_clip=1.0, eval_interval=250, eval_iters=20, log_interval=10,
    ),
    "gpu": dict(
        n_layers=6, n_heads=6, d_model=384, block_size=256, dropout=0.2, batch_size=64, max_iters=5000,
        lr=1e-3, min_lr=1e-4, warmup_iters=100, lr_decay_iters=5000, weight_decay=0.1, beta1=0.9, beta2=0.99,
        grad_clip=1.0, eval_interval=250, eval_iters=200, log_interval=10,
    ),
}  # fmt: skip
_MODEL_KEYS = ("n_layers", "n_heads", "d_model", "block_size", "dropout")

# (setting, type, help) of the flags that override a preset's settings.
_SETTING_FLAGS = [
    ("n_layers", int, "transformer blocks"),
    ("n_heads", int, "attention heads per block"),
    ("d_model", int, "width of the residual stream"),
    ("block_size", int, "context length T in characters"),
    ("dropout", float, "dropout probability"),
    ("batch_size", int, "sequences per step (per process under torchrun)"),
    ("max_iters", int, "optimizer steps in all"),
    ("lr", float, "peak learning rate"),
    ("min_lr", float, "learning rate at the end of the cosine decay"),
    ("warmup_iters", int, "steps of linear warm-up"),
    ("lr_decay_iters", int, "step at which the cosine decay reaches --min-lr"),
    ("weight_decay", float, "AdamW weight decay (matrices only)"),
    ("beta1", float, "AdamW beta1"),
    ("beta2", float, "AdamW beta2"),
    ("grad_clip", float, "clip the global gradient norm to this (0: off)"),
    ("eval_interval", int, "evaluate and save a checkpoint every this many steps"),
    ("eval_iters", int, "batches per split in each evaluation"),
    ("log_interval", int, "update the progress bar's loss every this many steps"),
]


def build_parser() -> argparse.ArgumentParser:
    """The training command's argument parser (``python -m transformer_lib.train --help``)."""
    parser = argparse.ArgumentParser(
        prog="python -m transformer_lib.train",
        description="Train a character-level GPT (chapter 9) on Tiny Shakespeare or on any text file. "
        "A preset sets every size and hyperparameter; the flags below override single settings. "
        "To generate text from a checkpoint: python -m transformer_lib.train sample --help",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--preset",
        choices=sorted(PRESETS),
        default=None,
        help="'cpu': nanoGPT's baby GPT (4 layers, 4 heads, 128 wide, context 64, 2000 steps); "
        "'gpu': 6 layers, 6 heads, 384 wide, context 256, 5000 steps (default: gpu if CUDA is "
        "available, else cpu)",
    )
    parser.add_argument(
        "--data",
        default=None,
        metavar="PATH",
        help="a UTF-8 text file to train on (default: Tiny Shakespeare from $TINY_SHAKESPEARE, "
        "the cache or one download; offline, the Python standard library's source)",
    )
    parser.add_argument("--val-fraction", type=float, default=0.1, help="last fraction of the text kept for validation")
    parser.add_argument("--out-dir", default="out", help="folder for ckpt.pt")
    parser.add_argument("--resume", action="store_true", help="continue from OUT_DIR/ckpt.pt exactly where it stopped")
    parser.add_argument("--seed", type=int, default=1337, help="seed of every random generator")
    parser.add_argument(
        "--device", default="auto", help="'auto' (CUDA, then MPS, then CPU), 'cpu', 'cuda', 'cuda:1'..."
    )
    parser.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", "float32", "bfloat16", "float16"],
        help="autocast precision; auto: bfloat16 on GPUs that support it, float32 elsewhere",
    )
    parser.add_argument(
        "--compile", action=argparse.BooleanOptionalAction, default=False, help="torch.compile the model"
    )
    parser.add_argument(
        "--peak-tflops",
        type=float,
        default=None,
        help="the GPU's dense bf16 peak for the MFU estimate (default: looked up, e.g. 989.4 for H100)",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    group = parser.add_argument_group("settings (default: the preset's, or the checkpoint's with --resume)")
    for name, type_, help_ in _SETTING_FLAGS:
        group.add_argument("--" + name.replace("_", "-"), type=type_, default=None, help=help_)
    return parser


def _init_distributed() -> tuple[int, int, int]:
    """Join the process group when launched by ``torchrun``; returns ``(rank, world_size, local_rank)``."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return 0, 1, 0
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    return dist.get_rank(), dist.get_world_size(), local_rank


def train_main(argv: Sequence[str] | None = None) -> int:
    """``python -m transformer_lib.train [flags]``: train a GPT on a text and save checkpoints."""
    parser = build_parser()
    args = parser.parse_args(argv)
    rank, world_size, local_rank = _init_distributed()
    say = print if rank == 0 else lambda *a, **k: None
    preset = args.preset or ("gpu" if torch.cuda.is_available() else "cpu")
    settings = dict(PRESETS[preset])
    given = {name: getattr(args, name) for name, _, _ in _SETTING_FLAGS if getattr(args, name) is not None}
    out_dir = Path(args.out_dir)
    ckpt = None
    if args.resume:
        file = out_dir / CHECKPOINT_NAME
        if not file.is_file():
            parser.error(f"--resume: no checkpoint at {file}")
        ckpt = torch.load(file, map_location="cpu", weights_only=True)
        settings.update(ckpt["meta"]["settings"])
        changed = [k for k in _MODEL_KEYS if k in given and given[k] != settings[k]]
        if changed:
            parser.error(f"--resume cannot change the model's shape ({', '.join(changed)})")
    settings.update(given)

    data_path = args.data or (ckpt["meta"].get("data") if ckpt else None)
    corpus = load_corpus(data_path)
    tokenizer = CharTokenizer.from_dict(ckpt["tokenizer"]) if ckpt else CharTokenizer.from_text(corpus.text)
    train_tokens, val_tokens = split_tokens(torch.tensor(tokenizer.encode(corpus.text)), args.val_fraction)

    device = args.device
    if world_size > 1 and torch.cuda.is_available() and device == "auto":
        device = f"cuda:{local_rank}"
    device = pick_device(device)
    set_seed(args.seed)
    model = GPT(GPTConfig(vocab_size=tokenizer.vocab_size, **{k: settings[k] for k in _MODEL_KEYS}))
    if world_size > 1:
        torch.manual_seed(args.seed + rank)  # the same initial model, different dropout on each rank
    batches = LMBatches(train_tokens, val_tokens, settings["block_size"], settings["batch_size"], device,
                        seed=args.seed, rank=rank, world_size=world_size)  # fmt: skip
    train_keys = {f.name for f in fields(TrainConfig)}
    config = TrainConfig(
        **{k: v for k, v in settings.items() if k in train_keys},
        device=str(device), dtype=args.dtype, compile=args.compile, out_dir=str(out_dir),
        progress=not args.no_progress, peak_tflops=args.peak_tflops,
    )  # fmt: skip
    say(
        f"{corpus.name}: {len(corpus.text):,} characters, vocabulary {tokenizer.vocab_size}; "
        f"GPT with {model.num_params() / 1e6:.2f}M parameters; preset {preset}; device {device}"
        + (f" x {world_size} processes" if world_size > 1 else "")
    )
    meta = {"settings": settings, "data": str(Path(data_path).resolve()) if data_path else None,
            "corpus": corpus.name, "seed": args.seed, "preset": preset}  # fmt: skip
    start = time.perf_counter()
    try:
        history = train(model, batches, config, tokenizer=tokenizer, meta=meta, resume=args.resume)
    except KeyboardInterrupt:
        say(f"Interrupted. Continue with: python -m transformer_lib.train --resume --out-dir {out_dir}")
        return 130
    finally:
        if world_size > 1:
            dist.destroy_process_group()
    if history.val_loss:
        say(f"final val loss {history.val_loss[-1]:.4f} after {history.eval_step[-1]} steps")
    if history.mfu is not None:
        say(f"model FLOPs utilisation {100 * history.mfu:.1f}% of the GPU's bf16 peak")
    say(f"{time.perf_counter() - start:.1f} s; checkpoint in {out_dir / CHECKPOINT_NAME}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: ``sample ...`` generates text from a checkpoint, anything else trains."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["sample"]:
        from .sample import main as sample_main  # imported here: sample.py imports this module

        return sample_main(argv[1:])
    return train_main(argv[1:] if argv[:1] == ["train"] else argv)


if __name__ == "__main__":
    sys.exit(main())
