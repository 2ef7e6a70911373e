"""The ``train`` command (chapter 9, "A GPT from scratch"; chapter 13's BPE tokens):
``python -m transformer_lib train [flags]`` trains a GPT on characters or on byte-level BPE
tokens and saves checkpoints; under ``torchrun`` it joins the process group and each rank trains
on its own share of every batch. Its flags and settings are in :mod:`transformer_lib.cli.settings`.
"""

from __future__ import annotations

import argparse
import os
import stat
import time
import warnings
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path

import torch
import torch.distributed as dist

from ..bpe import train_bpe
from ..checkpoint import CHECKPOINT_NAME, own_folder, read_checkpoint, tensor_checksum
from ..data import (
    PATH_ENV,
    CharTokenizer,
    LMBatches,
    load_corpus,
    load_tokenizer,
    save_tokenizer,
    sha256_of,
    tokenizer_checksum,
    tokenizer_from_dict,
)
from ..models import GPT, GPTConfig
from ..train import train
from ..train_config import PRESETS
from ..utils import pick_device, set_seed
from .settings import (
    BPE_VOCAB_DEFAULT,
    _add_setting_flags,
    _check_seed,
    _data_path,
    _parse,
    _Parser,
    _resumable,
    _run_settings,
    _settings,
)

__all__ = ["END_OF_TEXT", "TOKENIZER_NAME", "build_parser", "train_main"]


def build_parser() -> argparse.ArgumentParser:
    """The training command's argument parser (``python -m transformer_lib train --help``, chapter 9)."""
    parser = _Parser(
        prog="python -m transformer_lib train",
        description="Train a GPT (chapter 9) on Tiny Shakespeare or on any text file, reading characters or "
        "BPE tokens (chapter 13). "
        "A preset sets every size and hyperparameter; the flags below override single settings. "
        "To generate text from a checkpoint: python -m transformer_lib sample --help",
    )
    parser.add_argument(
        "--preset",
        choices=sorted(PRESETS),
        default=None,
        help="'cpu': nanoGPT's baby GPT (4 layers, 4 heads, 128 wide, context 64, 2000 steps); "
        "'gpu': 6 layers, 6 heads, 384 wide, context 256, 5000 steps; 'llama-cpu': cpu's size with "
        "Llama's block (RMSNorm, SwiGLU, rotary positions, no biases) (default: gpu if CUDA is "
        "available, else cpu)",
    )
    parser.add_argument(
        "--data",
        default=None,
        metavar="PATH",
        help="a UTF-8 text file to train on (default: Tiny Shakespeare from $TINY_SHAKESPEARE, "
        "the cache or one download; offline, the Python standard library's source)",
    )
    parser.add_argument(
        "--val-fraction", type=float, default=None, help="last fraction of the text kept for validation (default: 0.1)"
    )
    parser.add_argument("--out-dir", default="out", help="folder for ckpt.pt (default: out)")
    parser.add_argument("--resume", action="store_true", help="continue from OUT_DIR/ckpt.pt exactly where it stopped")
    parser.add_argument(
        "--force", action="store_true", help="start afresh even if OUT_DIR holds a checkpoint (replaced)"
    )
    parser.add_argument("--seed", type=int, default=None, help="seed of every random generator (default: 1337)")
    parser.add_argument(
        "--tokenizer",
        choices=["char", "bpe"],
        default=None,
        help="'char': one token per character (default); 'bpe': byte-level BPE (chapter 13), trained on the "
        "training split only and saved beside the checkpoint as tokenizer.json",
    )
    parser.add_argument(
        "--vocab-size", type=int, default=None, help=f"the BPE's vocabulary (default: {BPE_VOCAB_DEFAULT})"
    )
    _add_setting_flags(parser)
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


def _read_text(data_path: str | None, ckpt: dict | None, file: Path):
    """The training text (:func:`~transformer_lib.data.load_corpus`); on resume, a
    ``ValueError`` when it is not the text the run was trained on, naming where it was read from
    (the file, or the environment variable and its file). Its warnings are shown once it is known
    to be the right text (a wrong one needs the error, not a warning about the same file)."""
    meta = (ckpt or {}).get("meta") or {}
    recorded = meta.get("text_sha256")
    if not recorded:
        return load_corpus(data_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        corpus = load_corpus(data_path)
    if recorded != sha256_of(corpus.text.encode()):
        given, fix = f"{corpus.name} ({corpus.source})", "give that text with --data"
        if data_path is not None:
            given = str(data_path)
        elif os.environ.get(PATH_ENV) and corpus.source == str(Path(os.environ[PATH_ENV])):
            given = f"the file {corpus.source}, which the environment variable {PATH_ENV} names,"
            fix = f"unset {PATH_ENV}, or set it to that text's file"
        trained_on = meta.get("data") or meta.get("corpus")
        raise ValueError(f"{given} is not the text the run in {file} was trained on ({trained_on}): {fix}")
    for w in caught:
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return corpus


def _compare_replicas(model: torch.nn.Module, world_size: int) -> str:
    """One line saying whether every process ends with the same weights (chapter 9).

    Data-parallel training keeps one copy of the model per process and averages their gradients,
    so the copies must stay bit-identical; each process hashes its own weights and rank 0 compares.
    """
    digests = [None] * world_size
    dist.all_gather_object(digests, tensor_checksum(model.state_dict())[:12])
    if len(set(digests)) == 1:
        return f"weights identical on all {world_size} processes (checksum {digests[0]})"
    return f"warning: the {world_size} processes hold different weights: {', '.join(digests)}"


TOKENIZER_NAME = "tokenizer.json"  # a BPE run's tokenizer, beside its checkpoint (chapter 13)
# A BPE run's one special token, after the merges as in GPT-2; chapter 15 ends each fine-tuning response with it
END_OF_TEXT = "<|endoftext|>"


def _saved_tokenizer(tokenizer, folder: Path):
    """``tokenizer``, the one a checkpoint holds; if the checkpoint's folder also holds
    ``tokenizer.json``, that file must hold the same tokenizer (chapter 13), else a ``ValueError``
    naming the file."""
    path = folder / TOKENIZER_NAME
    if path.is_file():
        try:
            saved = load_tokenizer(path)
        except ValueError as e:
            raise ValueError(f"{e}; the checkpoint beside it holds its own copy of the tokenizer") from None
        if tokenizer_checksum(saved) != tokenizer_checksum(tokenizer):
            raise ValueError(
                f"{path} holds a different tokenizer from the one the checkpoint was trained with (checksum "
                f"{tokenizer_checksum(saved)[:12]}, not {tokenizer_checksum(tokenizer)[:12]}): restore that file, "
                f"or remove it to use the checkpoint's own copy"
            )
    return tokenizer


def _write_tokenizer(tokenizer, folder: Path, force: bool) -> None:
    """A fresh run's ``tokenizer.json`` beside its checkpoint (a BPE's; None: no file). Another
    run's file there is refused, or with ``force`` replaced or removed (its run is replaced)."""
    saved = folder / TOKENIZER_NAME
    if tokenizer is not None:
        save_tokenizer(tokenizer, saved, force=force)
    elif saved.exists() and not force:
        raise ValueError(f"{saved} holds another run's tokenizer: replace that run with --force")
    elif saved.exists():
        saved.unlink()


def train_main(argv: Sequence[str] | None = None) -> int:
    """``python -m transformer_lib train [flags]``: train a GPT on a text and save checkpoints (chapter 9)."""
    parser = build_parser()
    args, file = _parse(parser, argv)
    _check_seed(args.seed)
    if args.device is not None:
        pick_device(args.device)  # a device this machine cannot use is refused before the folder is made
    if not args.resume:
        _settings(args, None, file)  # a bad setting is refused before the folder is made
    # the run owns its folder from before its first read to its end; under torchrun rank 0 writes
    owner = own_folder(args.out_dir) if int(os.environ.get("RANK", "0")) == 0 else nullcontext()
    with owner:
        return _train_in_folder(args, file)


def _train_in_folder(args, file: Path) -> int:
    """The training run of :func:`train_main`, inside the folder it owns."""
    ckpt = None
    if args.resume:
        ckpt = _resumable(read_checkpoint(file), file, args.data)  # read once: settings, tokenizer, state
    elif file.exists() and not args.force:
        raise ValueError(f"{file} holds another run's checkpoint: continue it with --resume, replace it with "
                         f"--force, or choose another --out-dir")  # fmt: skip
    preset, shape, config = _settings(args, ckpt, file)
    run = _run_settings(args, ckpt, file)
    data_path = _data_path(args, ckpt, file)
    rank, world_size, local_rank = _init_distributed()
    say = print if rank == 0 else lambda *a, **k: None

    data_from = None
    if data_path is not None and os.path.exists(data_path) and not stat.S_ISREG(os.stat(data_path).st_mode):
        data_from = f"a pipe ({data_path})"  # read once: a resumed run cannot read it again
    corpus = _read_text(data_path, ckpt, file)
    text_sha256 = sha256_of(corpus.text.encode())
    n_train = int(len(corpus.text) * (1.0 - run["val_fraction"]))  # characters; the rest is validation
    if ckpt:
        tokenizer = _saved_tokenizer(tokenizer_from_dict(ckpt["tokenizer"]), Path(args.out_dir))
    elif run["tokenizer"] == "bpe":
        say(f"training a byte-level BPE of {run['vocab_size']} tokens on the training split")
        tokenizer = train_bpe(corpus.text[:n_train], run["vocab_size"], specials=(END_OF_TEXT,))
    else:
        tokenizer = CharTokenizer.from_text(corpus.text)
    if not ckpt and rank == 0:
        _write_tokenizer(tokenizer if run["tokenizer"] == "bpe" else None, Path(args.out_dir), args.force)
    train_tokens = torch.tensor(tokenizer.encode(corpus.text[:n_train]), dtype=torch.long)
    val_tokens = torch.tensor(tokenizer.encode(corpus.text[n_train:]), dtype=torch.long)

    wanted = config.device
    if world_size > 1 and torch.cuda.is_available() and wanted == "auto":
        wanted = f"cuda:{local_rank}"
    config = replace(config, device=pick_device(wanted))  # resolved once, kept as a torch.device
    set_seed(run["seed"])
    model = GPT(GPTConfig(vocab_size=tokenizer.vocab_size, **shape))
    if world_size > 1:
        torch.manual_seed(run["seed"] + rank)  # the same initial model, different dropout on each rank
    batches = LMBatches(train_tokens, val_tokens, shape["context_len"], config.batch_size, device=config.device,
                        seed=run["seed"], rank=rank, world_size=world_size)  # fmt: skip
    say(
        f"{corpus.name}: {len(corpus.text):,} characters, {len(train_tokens) + len(val_tokens):,} tokens of a "
        f"{tokenizer.kind} vocabulary of {tokenizer.vocab_size}; "
        f"GPT with {model.num_params() / 1e6:.2f}M parameters; preset {preset}; device {config.device}"
        + (f" x {world_size} processes" if world_size > 1 else "")
    )
    meta = {"data": str(Path(data_path).resolve()) if data_path and not data_from else None, "data_from": data_from,
            "corpus": corpus.name, "text_sha256": text_sha256, **run, "preset": run["preset"] or preset,
            "tokenizer_sha256": tokenizer_checksum(tokenizer)}  # fmt: skip
    start = time.perf_counter()
    try:
        history = train(model, batches, config, tokenizer=tokenizer, meta=meta, resume=ckpt or False)
        if world_size > 1:
            say(_compare_replicas(model, world_size))
    except KeyboardInterrupt:
        say(f"Interrupted. Continue with: python -m transformer_lib train --resume --out-dir {args.out_dir}")
        return 130
    finally:
        if world_size > 1:
            dist.destroy_process_group()
    if history.val_loss:
        say(f"final val loss {history.val_loss[-1]:.4f} after {history.eval_step[-1]} steps")
    if history.mfu is not None:
        say(f"model FLOPs utilisation {100 * history.mfu:.1f}% of the GPU's bf16 peak")
    say(f"{time.perf_counter() - start:.1f} s; checkpoint in {Path(args.out_dir) / CHECKPOINT_NAME}")
    return 0
