"""The ``finetune`` command (chapter "Fine-tuning"): ``python -m transformer_lib finetune --ckpt
BASE --data PAIRS.jsonl --out-dir DIR [--lora-rank R]`` fine-tunes a GPT checkpoint on
prompt/response pairs, every weight or (``--lora-rank``) low-rank adapters only.

Each pair is laid out as ``prompt, PROMPT_END, response, <|endoftext|>`` and the loss is taken on
the response and the end token only (:class:`~transformer_lib.data.instructions.InstructionBatches`).
The last ``max(1, int(val_fraction * n))`` pairs of the file are the validation split, the rest
train. The run keeps every guarantee of the ``train`` command: it owns its folder, writes
atomically, resumes exactly, refuses another data file, base or LoRA setting on resume, and
saves on Ctrl-C. A LoRA run also writes ``DIR/adapter.pt`` (the adapters alone) at every save.
"""

from __future__ import annotations

import argparse
import io
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from ..data import load_corpus, sha256_of, tokenizer_checksum
from ..data.instructions import PROMPT_END, InstructionBatches, encode_pair, read_pairs
from ..finetune import lora_targets
from ..lora import add_lora, count_parameters
from ..resume import changed, flag, resume_config, resume_record, resumed_file
from ..run import ADAPTER_NAME, DEFAULTS, RunFolder, RunRecord, read_base, start_model
from ..token_rows import add_token_rows, unseen_token_rows
from ..train import train
from ..train_config import TrainConfig
from ..utils import pick_device, set_seed
from .settings import (
    Parser,
    add_setting_flags,
    check_lora_flags,
    check_seed,
    owned_run_folder,
    parse_run_flags,
    training_flags,
)

__all__ = ["ADAPTER_NAME", "FINETUNE_DEFAULTS", "finetune_main"]

#: Fine-tuning's training settings where they differ from :class:`~transformer_lib.train_config.TrainConfig`'s
#: pretraining defaults (chapter "Fine-tuning"): short runs, a warm-up, no weight decay, and a peak learning
#: rate by method (adapters start at zero and take larger steps than a full fine-tuning's every
#: weight). ``min_lr`` is a tenth of whichever ``--lr`` the run uses.
FINETUNE_DEFAULTS = {
    "max_iters": 300,
    "lr": {"lora": 1e-3, "full": 3e-4},
    "min_lr": "lr / 10",
    "warmup_iters": 20,
    "eval_interval": 50,
    "batch_size": 16,
    "weight_decay": 0.0,
}


# FINETUNE_DEFAULTS as the help texts write them
_SHOWN_DEFAULTS = {**FINETUNE_DEFAULTS, "lr": "1e-3 with --lora-rank, 3e-4 without", "min_lr": "a tenth of --lr"}
_SHIPPED = "transformer_lib/data/ch15/pretrained.pt"  # PRETRAINED_PATH, as a user in the repository types it


def build_parser() -> argparse.ArgumentParser:
    """The fine-tuning command's argument parser (``python -m transformer_lib finetune --help``, chapter
    "Fine-tuning")."""
    parser = Parser(
        prog="python -m transformer_lib finetune",
        description="Fine-tune a GPT checkpoint (a BPE run of python -m transformer_lib train, whose tokenizer has "
        '<|endoftext|>) on prompt/response pairs (chapter "Fine-tuning"): every weight, or with --lora-rank '
        "only low-rank adapters. The loss counts the response and its end token. Sample the result with python -m "
        "transformer_lib sample --ckpt OUT_DIR (full) or --ckpt BASE --adapter OUT_DIR/adapter.pt (LoRA). "
        "Typical time on a laptop: under a minute for the default 300 steps on the book's shipped base, the first "
        "evaluation (before the progress bar starts) included.",
    )
    parser.add_argument(
        "--ckpt",
        default=None,
        help="the base: a BPE run's folder or checkpoint file, such as "
        f"the book's shipped 6,000-step base {_SHIPPED} (required; with --resume: the run's "
        f"own)",
    )
    parser.add_argument(
        "--data",
        default=None,
        metavar="FILE.jsonl",
        help='one {"prompt": ..., "response": ...} a line; the '
        "last --val-fraction of the pairs (at least one) validate, the rest train (with --resume: the run's own)",
    )
    parser.add_argument(
        "--val-fraction", type=float, default=None, help="last fraction of the pairs kept for validation (default: 0.1)"
    )
    parser.add_argument(
        "--out-dir", "--output-dir", default="out/finetune", help="folder for ckpt.pt (default: out/finetune)"
    )
    parser.add_argument("--resume", action="store_true", help="continue from OUT_DIR/ckpt.pt exactly where it stopped")
    parser.add_argument("--force", action="store_true", help="start afresh even if OUT_DIR holds a checkpoint")
    parser.add_argument("--seed", type=int, default=None, help="seed of every random generator (default: 1337)")
    parser.add_argument(
        "--lora-rank",
        "--lora-r",
        type=int,
        default=None,
        help="train only adapters of this rank "
        "on every attention and feed-forward matrix, written to OUT_DIR/adapter.pt (default: none, "
        "full fine-tuning)",
    )
    parser.add_argument(
        "--lora-alpha",
        type=float,
        default=None,
        help="the adapters' scale alpha, applied as alpha / rank (default: 2 x --lora-rank)",
    )
    parser.add_argument(
        "--new-token-rows",
        action="store_true",
        default=None,
        help="with --lora-rank: also train, "
        "re-initialised, the embedding rows of the tokens the pairs use that the base's training "
        "text never held (LoRA freezes the embedding, and those rows never learned anything; "
        'chapter "Fine-tuning") (default: off)',
    )
    add_setting_flags(parser, shape=False, defaults=_SHOWN_DEFAULTS)
    return parser


def finetune_main(argv: Sequence[str] | None = None) -> int:
    """``python -m transformer_lib finetune``: fine-tune a GPT on prompt/response pairs (chapter "Fine-tuning")."""
    parser = build_parser()
    args, folder = parse_run_flags(parser, argv)
    if not args.resume and (args.ckpt is None or args.data is None):
        parser.error("give the base checkpoint with --ckpt and the pairs with --data FILE.jsonl")
    check_seed(args.seed)
    check_lora_flags(args)
    if args.device is not None:
        pick_device(args.device)  # a device this machine cannot use is refused before the folder is made
    for path, what in ((args.ckpt, "no base checkpoint"), (args.data, "no data file")):
        if path is not None and not Path(path).exists():
            raise FileNotFoundError(f"{what} at {path}")
    with owned_run_folder(folder):
        return _finetune_in_folder(args, folder)


def finetune_record(args, resumed: RunRecord | None, file: Path) -> RunRecord:
    """What a fine-tuning run is, as far as its flags say: the LoRA rank and alpha, seed and split
    (or their defaults), or on resume the run's, a flag that differs refused."""
    given = {
        "lora_rank": args.lora_rank,
        "lora_alpha": args.lora_alpha,
        "seed": args.seed,
        "val_fraction": args.val_fraction,
    }
    if resumed is not None:
        if args.new_token_rows and not resumed.token_rows:
            raise changed("new_token_rows", "no new token rows", "--new-token-rows", file)
        return resume_record(resumed, given, file)
    for name in ("lora_alpha", "new_token_rows"):
        if getattr(args, name) is not None and args.lora_rank is None:
            raise ValueError(f"{flag(name)} is for --lora-rank: full fine-tuning has no adapters")
    run = {k: DEFAULTS.get(k) if v is None else v for k, v in given.items()}
    if run["lora_rank"] is not None and run["lora_alpha"] is None:
        run["lora_alpha"] = 2.0 * run["lora_rank"]
    if not 0 < run["val_fraction"] < 1:
        raise ValueError(f"--val-fraction must be in (0, 1), got {run['val_fraction']}")
    return RunRecord(kind="finetune", **run)


def finetune_config(args, record: RunRecord, ckpt: dict | None, file: Path) -> TrainConfig:
    """:data:`FINETUNE_DEFAULTS` (the lr by method, min_lr a tenth of --lr), the checkpoint's on resume, the flags."""
    lr = args.lr if args.lr is not None else FINETUNE_DEFAULTS["lr"][record.method]
    plain = {k: v for k, v in FINETUNE_DEFAULTS.items() if k not in ("lr", "min_lr")}
    return resume_config(TrainConfig(**plain, lr=lr, min_lr=lr / 10), ckpt, training_flags(args), file)


def _pairs(data: str, tokenizer, context_len: int, val_fraction: float) -> tuple[list, list]:
    """The pairs of ``data`` encoded, split into train and validation; a pair longer than the model
    reads is refused by its line number, as are fewer than two pairs."""
    pairs = read_pairs(data, specials=tuple(getattr(tokenizer, "special_ids", {})) or ("<|endoftext|>",))
    if len(pairs) < 2:
        raise ValueError(f"{data} holds 1 pair: fine-tuning needs at least 2 (one to train on, one to validate)")
    text = Path(data).read_bytes().decode("utf-8-sig")
    lines = [n for n, line in enumerate(io.StringIO(text, newline=None), start=1) if line.strip()]
    encoded = [encode_pair(tokenizer, p, r) for p, r in pairs]
    for (ids, _), line in zip(encoded, lines, strict=True):
        if len(ids) > context_len + 1:
            raise ValueError(
                f"{data}, line {line}: the pair is {len(ids)} tokens (prompt, {PROMPT_END!r}, response and the end "
                f"token); the base model reads {context_len} (+1 target): shorten it or leave it out"
            )
    n_val = max(1, int(len(pairs) * val_fraction))
    return encoded[:-n_val], encoded[-n_val:]


def new_token_rows(base: dict, base_file: Path, tokenizer, data: str) -> list[int]:
    """``--new-token-rows``: the tokens the pairs in ``data`` use that the base's training split (the
    text its record names, checked by its checksum) never held (chapter "Fine-tuning")."""
    record = RunRecord.from_checkpoint(base)
    source = record.data if record.data else None if record.corpus == "tiny_shakespeare" else False
    if source is False or record.data_from or (source and not Path(source).is_file()):
        raise ValueError(
            f"--new-token-rows needs the text {base_file} was trained on, and its record names none "
            f"that can be read again ({record.data_from or record.data or record.corpus})"
        )
    text = load_corpus(source).text
    if sha256_of(text.encode()) != record.data_sha256:
        raise ValueError(
            f"--new-token-rows: the text at {source or 'the shipped corpus'} is not the one {base_file} "
            f"was trained on (its checksum differs)"
        )
    used = "".join(p + PROMPT_END + r for p, r in read_pairs(data))
    rows = unseen_token_rows(tokenizer, text[: int(len(text) * (1 - record.val_fraction))], among=used)
    if not rows:
        raise ValueError(f"--new-token-rows: every token of {data} occurs in the base's training text: no new rows")
    return rows


def _adapt(model, record: RunRecord, new_rows: bool | None, find_rows) -> RunRecord:
    """A LoRA run's adapters on ``model`` and, with ``new_rows`` (or a resumed run's record), its
    trainable token rows, re-initialised (on resume the checkpoint's values replace them); the
    record, with the rows ``find_rows()`` gave a fresh run."""
    if record.method != "lora":
        return record
    try:
        add_lora(model, lora_targets(model), rank=record.lora_rank, alpha=record.lora_alpha, seed=record.seed)
    except ValueError as e:
        raise ValueError(f"--lora-rank {record.lora_rank}: {e}") from None
    if new_rows and record.token_rows is None:
        record = replace(record, token_rows=tuple(find_rows()))
    if record.token_rows:
        add_token_rows(model, record.token_rows, reinit=True, seed=record.seed)
    return record


def _finetune_in_folder(args, folder: RunFolder) -> int:
    """The fine-tuning run of :func:`finetune_main`, inside the folder it owns."""
    file = folder.checkpoint
    ckpt, resumed = folder.resumed("finetune", args.resume, args.force, start=args.ckpt)
    record = finetune_record(args, resumed, file)
    config = finetune_config(args, record, ckpt, file)
    base, base_file = read_base(args.ckpt, resumed, file)
    data, data_sha256 = resumed_file(args.data, resumed, file)
    model, tokenizer = start_model(base, base_file, needs_end=True)
    train_pairs, val_pairs = _pairs(data, tokenizer, model.config.context_len, record.val_fraction)
    device = pick_device(config.device)
    set_seed(record.seed)
    model.train()
    record = _adapt(model, record, args.new_token_rows, lambda: new_token_rows(base, base_file, tokenizer, data))
    if not ckpt:
        folder.write_tokenizer(tokenizer, args.force)
        folder.clear_adapter(args.force)  # --force replaces the run that wrote it
    batches = InstructionBatches(
        train_pairs,
        val_pairs,
        model.config.context_len,
        config.batch_size,
        tokenizer.eos_id,
        seed=record.seed,
        device=device,
    )
    record = replace(
        record,
        base=str(base_file.resolve()),
        base_sha256=base["checksum"],
        data=str(Path(data).resolve()),
        data_sha256=data_sha256,
        corpus=Path(data).name,
        n_train=len(train_pairs),
        n_val=len(val_pairs),
        tokenizer_sha256=tokenizer_checksum(tokenizer),
    )
    print(
        f"{Path(data).name}: {len(train_pairs)} pairs to train on, {len(val_pairs)} to validate; "
        f"{record.method} fine-tuning of {base_file} ({count_parameters(model):,} of "
        f"{count_parameters(model, trainable=False):,} parameters trained); device {device}"
    )
    try:
        history = train(
            model,
            batches,
            config,
            tokenizer=tokenizer,
            meta=record.to_meta(),
            resume=ckpt or False,
            on_save=folder.adapter_writer(model, record),
        )
    except KeyboardInterrupt:
        print(f"Interrupted. Continue with: python -m transformer_lib finetune --resume --out-dir {args.out_dir}")
        return 130
    if history.val_loss:
        print(f"final val loss {history.val_loss[-1]:.4f} after {history.eval_step[-1]} steps")
    print(f"checkpoint in {file}")
    if folder.adapter.is_file():
        print(f"adapter in {folder.adapter} ({folder.adapter.stat().st_size / 1024:.1f} KiB)")
    return 0
