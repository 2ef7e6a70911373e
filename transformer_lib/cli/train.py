"""The ``train`` command (chapter "A GPT from scratch"; chapter "Tokens"'s BPE tokens):
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
from ..checkpoint import tensor_checksum
from ..data import PATH_ENV, CharTokenizer, LMBatches, load_corpus, sha256_of, tokenizer_checksum, tokenizer_from_dict
from ..models import GPT, GPTConfig
from ..resume import resumable_pretraining, resumed_data
from ..run import RunFolder, RunRecord
from ..train import train
from ..train_config import PRESETS
from ..utils import pick_device, set_seed
from .settings import (
    BPE_VOCAB_DEFAULT,
    Parser,
    add_setting_flags,
    check_model_shape,
    check_seed,
    model_settings,
    owned_run_folder,
    parse_run_flags,
    pretrain_record,
)

__all__ = ["END_OF_TEXT", "build_parser", "train_main"]


def build_parser() -> argparse.ArgumentParser:
    """The training command's argument parser (``python -m transformer_lib train --help``, chapter "A GPT from
    scratch")."""
    parser = Parser(
        prog="python -m transformer_lib train",
        description='Train a GPT (chapter "A GPT from scratch") on Tiny Shakespeare or on any text file, reading '
        'characters or BPE tokens (chapter "Tokens"). '
        "A preset sets every size and hyperparameter; the flags below override single settings, and each "
        "says its default. --preset cpu's 2,000 steps take about 2 minutes on one CPU thread (--max-iters 200 "
        "about 15 seconds). To generate text from a checkpoint: python -m transformer_lib sample --help",
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
        help="a UTF-8 text file to train on (default: Tiny Shakespeare, the copy shipped with the package, "
        "transformer_lib/data/tinyshakespeare.txt; $TINY_SHAKESPEARE names another copy; without the shipped "
        "one, the cache or one download; when none can be had, the Python standard library's source)",
    )
    parser.add_argument(
        "--val-fraction", type=float, default=None, help="last fraction of the text kept for validation (default: 0.1)"
    )
    parser.add_argument("--out-dir", "--output-dir", default="out", help="folder for ckpt.pt (default: out)")
    parser.add_argument("--resume", action="store_true", help="continue from OUT_DIR/ckpt.pt exactly where it stopped")
    parser.add_argument(
        "--force", action="store_true", help="start afresh even if OUT_DIR holds a checkpoint (replaced)"
    )
    parser.add_argument("--seed", type=int, default=None, help="seed of every random generator (default: 1337)")
    parser.add_argument(
        "--tokenizer",
        choices=["char", "bpe"],
        default=None,
        help="'char': one token per character (default); 'bpe': byte-level BPE (chapter \"Tokens\"), trained on the "
        "training split only and saved beside the checkpoint as tokenizer.json",
    )
    parser.add_argument(
        "--vocab-size", type=int, default=None, help=f"the BPE's vocabulary (default: {BPE_VOCAB_DEFAULT})"
    )
    add_setting_flags(parser)
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


def _read_text(data_path: str | None, resumed: RunRecord | None, file: Path):
    """The training text (:func:`~transformer_lib.data.load_corpus`); on resume, a
    ``ValueError`` when it is not the text the run was trained on, naming where it was read from
    (the file, or the environment variable and its file). Its warnings are shown once it is known
    to be the right text (a wrong one needs the error, not a warning about the same file)."""
    recorded = resumed.data_sha256 if resumed is not None else None
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
        trained_on = resumed.data or resumed.corpus
        raise ValueError(f"{given} is not the text the run in {file} was trained on ({trained_on}): {fix}")
    for w in caught:
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return corpus


def _compare_replicas(model: torch.nn.Module, world_size: int) -> str:
    """One line saying whether every process ends with the same weights (chapter "A GPT from scratch").

    Data-parallel training keeps one copy of the model per process and averages their gradients,
    so the copies must stay bit-identical; each process hashes its own weights and rank 0 compares.
    """
    digests = [None] * world_size
    dist.all_gather_object(digests, tensor_checksum(model.state_dict())[:12])
    if len(set(digests)) == 1:
        return f"weights identical on all {world_size} processes (checksum {digests[0]})"
    return f"warning: the {world_size} processes hold different weights: {', '.join(digests)}"


# A BPE run's one special token, after the merges as in GPT-2; chapter "Fine-tuning" ends each fine-tuning response with
# it
END_OF_TEXT = "<|endoftext|>"


def train_main(argv: Sequence[str] | None = None) -> int:
    """``python -m transformer_lib train [flags]``: train a GPT on a text and save checkpoints (chapter "A GPT from
    scratch")."""
    parser = build_parser()
    args, folder = parse_run_flags(parser, argv)
    check_seed(args.seed)
    if args.device is not None:
        pick_device(args.device)  # a device this machine cannot use is refused before the folder is made
    if not args.resume:
        _, shape, _ = model_settings(args, None, folder.checkpoint)  # a bad setting is refused before the folder
        check_model_shape(shape, vars(args))  # ... and so is a shape the model cannot take
    # the run owns its folder from before its first read to its end; under torchrun rank 0 writes
    with owned_run_folder(folder) if int(os.environ.get("RANK", "0")) == 0 else nullcontext():
        return _train_in_folder(args, folder)


def _tokenizer(corpus, n_train: int, record: RunRecord, ckpt: dict | None, folder: RunFolder, say):
    """The run's tokenizer: on resume the checkpoint's, else a BPE trained on the training split
    or the text's characters; a fresh BPE run writes it to ``tokenizer.json``."""
    if ckpt:
        return folder.checked_tokenizer(tokenizer_from_dict(ckpt["tokenizer"]))
    if record.tokenizer == "bpe":
        say(f"training a byte-level BPE of {record.vocab_size} tokens on the training split")
        return train_bpe(corpus.text[:n_train], record.vocab_size, specials=(END_OF_TEXT,))
    return CharTokenizer.from_text(corpus.text)


def _train_in_folder(args, folder: RunFolder) -> int:
    """The training run of :func:`train_main`, inside the folder it owns."""
    file = folder.checkpoint
    ckpt, resumed = folder.resumed("pretrain", args.resume, args.force)  # read once: settings, tokenizer, state
    if ckpt is not None:
        resumable_pretraining(ckpt, file, args.data)
    preset, shape, config = model_settings(args, ckpt, file)
    record = pretrain_record(args, resumed, file)
    data_path = resumed_data(args.data, resumed, file)
    rank, world_size, local_rank = _init_distributed()
    say = print if rank == 0 else lambda *a, **k: None

    data_from = None
    if data_path is not None and os.path.exists(data_path) and not stat.S_ISREG(os.stat(data_path).st_mode):
        data_from = f"a pipe ({data_path})"  # read once: a resumed run cannot read it again
    corpus = _read_text(data_path, resumed, file)
    n_train = int(len(corpus.text) * (1.0 - record.val_fraction))  # characters; the rest is validation
    tokenizer = _tokenizer(corpus, n_train, record, ckpt, folder, say)
    if not ckpt and rank == 0:
        folder.write_tokenizer(tokenizer if record.tokenizer == "bpe" else None, args.force)
    train_tokens = torch.tensor(tokenizer.encode(corpus.text[:n_train]), dtype=torch.long)
    val_tokens = torch.tensor(tokenizer.encode(corpus.text[n_train:]), dtype=torch.long)

    wanted = config.device
    if world_size > 1 and torch.cuda.is_available() and wanted == "auto":
        wanted = f"cuda:{local_rank}"
    config = replace(config, device=pick_device(wanted))  # resolved once, kept as a torch.device
    set_seed(record.seed)
    model = GPT(GPTConfig(vocab_size=tokenizer.vocab_size, **shape))
    if world_size > 1:
        torch.manual_seed(record.seed + rank)  # the same initial model, different dropout on each rank
    batches = LMBatches(
        train_tokens,
        val_tokens,
        shape["context_len"],
        config.batch_size,
        device=config.device,
        seed=record.seed,
        rank=rank,
        world_size=world_size,
    )
    say(
        f"{corpus.name}: {len(corpus.text):,} characters, {len(train_tokens) + len(val_tokens):,} tokens of a "
        f"{tokenizer.kind} vocabulary of {tokenizer.vocab_size}; "
        f"GPT with {model.num_params() / 1e6:.2f}M parameters; preset {preset}; device {config.device}"
        + (f" x {world_size} processes" if world_size > 1 else "")
    )
    record = replace(
        record,
        data=str(Path(data_path).resolve()) if data_path and not data_from else None,
        data_from=data_from,
        corpus=corpus.name,
        data_sha256=sha256_of(corpus.text.encode()),
        preset=record.preset or preset,
        tokenizer_sha256=tokenizer_checksum(tokenizer),
    )
    start = time.perf_counter()
    try:
        history = train(model, batches, config, tokenizer=tokenizer, meta=record.to_meta(), resume=ckpt or False)
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
    say(f"{time.perf_counter() - start:.1f} s; checkpoint in {file}")
    return 0
