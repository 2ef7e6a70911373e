"""The ``dpo`` and ``grpo`` commands (chapter "Preferences and rewards")::

    python -m transformer_lib dpo --ckpt BASE --data PREFS.jsonl --out-dir DIR
    python -m transformer_lib grpo --ckpt BASE --data PAIRS.jsonl --out-dir DIR

``dpo`` tunes a GPT on preferences, one ``{"prompt": ..., "chosen": ..., "rejected": ...}`` a line
(:class:`~transformer_lib.preference_runs.DPOBatches`); ``grpo`` on rewards of its own sampled
answers to the prompts of ``{"prompt": ..., "response": ...}`` lines, the response being the
target the reward checks (:class:`~transformer_lib.preference_runs.GRPOBatches`). The start is
``--ckpt`` with the adapter file ``--adapter`` merged into it (chapter "Fine-tuning"'s LoRA fine-tune, say);
``--lora-rank`` trains fresh adapters (the reference: the start, the adapters off), else every
weight (the reference: a frozen copy of the start). The last ``--val-fraction`` of the lines
validate. Each run keeps the ``finetune`` command's guarantees: it owns its folder, resumes
exactly, and refuses on ``--resume`` another start, data, LoRA setting or objective setting.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from ..data import sha256_of, tokenizer_checksum
from ..data.instructions import read_pairs
from ..data.verifiable import REWARDS, read_preferences
from ..lora import count_parameters
from ..preference import ADVANTAGE_SCALES, GRPO_LOSS_TYPES
from ..preference_runs import DPOBatches, GRPOBatches, make_policy
from ..resume import changed, resume_config, resume_record, resumed_file
from ..resume import flag as _flag
from ..run import DEFAULTS, RunFolder, RunRecord, read_base, start_model
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

__all__ = ["TUNE_DEFAULTS", "dpo_main", "grpo_main"]

#: The training settings of the two commands where they differ from TrainConfig's (chapter "Preferences and rewards").
TUNE_DEFAULTS = {
    "dpo": {
        "max_iters": 200,
        "lr": {"lora": 1e-3, "full": 1e-5},
        "warmup_iters": 10,
        "eval_interval": 50,
        "eval_iters": 5,
        "batch_size": 8,
        "weight_decay": 0.0,
    },
    "grpo": {
        "max_iters": 100,
        "lr": {"lora": 3e-3, "full": 3e-5},
        "warmup_iters": 10,
        "eval_interval": 25,
        "eval_iters": 2,
        "batch_size": 8,
        "weight_decay": 0.0,
    },
}
#: Each objective's settings (flag, type, default, help): recorded in the run and fixed on resume.
OBJECTIVES = {
    "dpo": {
        "beta": (float, 0.1, "DPO's beta: how far from the reference the preferences may pull"),
        "average": (bool, False, "score an answer by its mean log-probability per token, not the sum"),
    },
    "grpo": {
        "reward": (str, "exact", f"the reward, one of {sorted(REWARDS)}"),
        "group_size": (int, 8, "answers sampled to each prompt (TRL's num_generations)"),
        "temperature": (float, 1.0, "the sampling temperature (the log-probabilities use it too)"),
        "max_new_tokens": (int, 16, "the longest answer, in tokens (TRL's max_completion_length)"),
        "beta": (float, 0.04, "the weight of the KL penalty to the reference (0: none)"),
        "loss_type": (str, "grpo", f"how the token losses are averaged, one of {GRPO_LOSS_TYPES}"),
        "scale": (
            str,
            "group",
            "what the centred rewards are divided by: their group's std, the batch's, or "
            "none (TRL's scale_rewards, the same choices)",
        ),
        "clip": (float, 0.2, "the ratio's clip range (TRL's epsilon)"),
    },
}
_CHOICES = {"reward": sorted(REWARDS), "loss_type": list(GRPO_LOSS_TYPES), "scale": list(ADVANTAGE_SCALES)}
#: The names TRL's GRPOTrainer gives the same GRPO settings, accepted as the same flags.
TRL_NAMES = {
    "group_size": ("--num-generations",),
    "max_new_tokens": ("--max-completion-length",),
    "clip": ("--epsilon",),
    "scale": ("--scale-rewards",),
}
#: Flags of TRL that mean something else here, refused with why (``grpo`` only).
GRPO_REFUSED = {
    "--per-device-train-batch-size": "counts answers in TRL's GRPOTrainer, but this command's --batch-size counts "
    "prompts (each sampled --group-size times): give --batch-size PROMPTS",
}
DESCRIPTIONS = {
    "dpo": 'Tune a GPT on preferences (chapter "Preferences and rewards", DPO): each line of --data is a prompt with'
    " a chosen and a rejected answer, and the model learns to rank the chosen one higher than a frozen "
    "reference does (the start itself; with --lora-rank, the start with the adapters off). The start is "
    "--ckpt, with --adapter merged in. Typical time on one CPU thread: under half a minute for the default "
    "200 steps from the book's shipped model with LoRA.",
    "grpo": 'Tune a GPT on rewards of its own answers (chapter "Preferences and rewards", GRPO): for each prompt of '
    "--data the model samples --group-size answers, --reward scores each against the line's response, and the"
    " answers better than their group's mean are made more likely; the KL penalty --beta keeps it near the "
    "reference. The console prints the mean reward of each split. TRL's names are accepted (--num-"
    "generations, --max-completion-length, --epsilon, --beta, --scale-rewards). Typical time on one CPU "
    "thread: about a minute for the default 100 steps from the book's shipped model with LoRA.",
}


def build_parser(kind: str) -> Parser:
    """The parser of ``python -m transformer_lib dpo`` or ``grpo`` (chapter "Preferences and rewards")."""
    data = '{"prompt", "chosen", "rejected"}' if kind == "dpo" else '{"prompt", "response"} (the target)'
    refused = GRPO_REFUSED if kind == "grpo" else {}
    parser = Parser(prog=f"python -m transformer_lib {kind}", description=DESCRIPTIONS[kind], refused=refused)
    parser.add_argument(
        "--ckpt",
        default=None,
        help="the start: a BPE GPT checkpoint or run folder (required; with --resume: the run's own)",
    )
    parser.add_argument("--adapter", default=None, help="an adapter file on --ckpt, merged into the start")
    parser.add_argument("--data", default=None, metavar="FILE.jsonl", help=f"one {data} a line")
    parser.add_argument(
        "--val-fraction", type=float, default=None, help="last fraction of lines that validate (default: 0.1)"
    )
    parser.add_argument("--out-dir", "--output-dir", default=f"out/{kind}", help=f"(default: out/{kind})")
    parser.add_argument("--resume", action="store_true", help="continue from OUT_DIR/ckpt.pt exactly")
    parser.add_argument("--force", action="store_true", help="start afresh even if OUT_DIR holds a checkpoint")
    parser.add_argument("--seed", type=int, default=None, help="seed of every random generator (default: 1337)")
    parser.add_argument(
        "--lora-rank",
        "--lora-r",
        type=int,
        default=None,
        help="train fresh adapters of this rank (default: none, every weight)",
    )
    parser.add_argument("--lora-alpha", type=float, default=None, help="(default: 2 x --lora-rank)")
    group = parser.add_argument_group(f"the {kind.upper()} objective (fixed on --resume)")
    for name, (type_, default, help_) in OBJECTIVES[kind].items():
        names = (_flag(name), *(TRL_NAMES.get(name, ()) if kind == "grpo" else ()))
        if type_ is bool:
            group.add_argument(*names, dest=name, action="store_true", default=None, help=help_)
        else:
            group.add_argument(
                *names,
                dest=name,
                type=type_,
                default=None,
                choices=_CHOICES.get(name),
                help=f"{help_} (default: {default})",
            )
    rates = TUNE_DEFAULTS[kind]["lr"]
    shown = {
        **TUNE_DEFAULTS[kind],
        "lr": f"{rates['lora']:g} with --lora-rank, {rates['full']:g} without",
        "min_lr": "a tenth of --lr",
    }
    add_setting_flags(parser, shape=False, defaults=shown)
    return parser


def dpo_main(argv: Sequence[str] | None = None) -> int:
    """``python -m transformer_lib dpo``: tune a GPT on preference pairs (chapter "Preferences and rewards")."""
    return _main("dpo", argv)


def grpo_main(argv: Sequence[str] | None = None) -> int:
    """``python -m transformer_lib grpo``: tune a GPT on rewards of its sampled answers (chapter "Preferences and
    rewards")."""
    return _main("grpo", argv)


def _main(kind: str, argv) -> int:
    parser = build_parser(kind)
    args, folder = parse_run_flags(parser, argv)
    if not args.resume and (args.ckpt is None or args.data is None):
        parser.error("give the start checkpoint with --ckpt and the data with --data FILE.jsonl")
    check_seed(args.seed)
    check_lora_flags(args)
    _check_objective(kind, args)
    if args.device is not None:
        pick_device(args.device)
    for path, what in ((args.ckpt, "no start checkpoint"), (args.data, "no data file"), (args.adapter, "no adapter")):
        if path is not None and not Path(path).exists():
            raise FileNotFoundError(f"{what} at {path}")
    with owned_run_folder(folder):
        return _tune_in_folder(kind, args, folder)


def _check_objective(kind: str, args) -> None:
    """Each objective flag given, in its range: the group, length, temperature and clip positive,
    GRPO's beta >= 0 and DPO's > 0."""
    for name in ("group_size", "max_new_tokens"):
        value = getattr(args, name, None)
        if value is not None and value < (2 if name == "group_size" else 1):
            raise ValueError(f"{_flag(name)} must be an int >= {2 if name == 'group_size' else 1}, got {value}")
    for name in ("temperature", "clip", "beta"):
        value = getattr(args, name, None)
        zero_ok = name == "beta" and kind == "grpo"
        if value is not None and (value != value or not (value >= 0 if zero_ok else value > 0)):
            raise ValueError(f"{_flag(name)} must be a number {'>= 0' if zero_ok else '> 0'}, got {value}")


def _objective(kind: str, args, resumed: RunRecord | None, file: Path) -> dict:
    """The objective's settings: the flags, their defaults, or on resume the run's (a different flag refused)."""
    given = {name: getattr(args, name) for name in OBJECTIVES[kind]}
    if resumed is None:
        return {name: spec[1] if given[name] is None else given[name] for name, spec in OBJECTIVES[kind].items()}
    recorded = resumed.objective or {}
    for name, value in given.items():
        if value is not None and value != recorded.get(name):
            raise changed(name, recorded.get(name), value, file)
    return recorded


def _record(kind: str, args, resumed: RunRecord | None, file: Path) -> RunRecord:
    given = {
        "lora_rank": args.lora_rank,
        "lora_alpha": args.lora_alpha,
        "seed": args.seed,
        "val_fraction": args.val_fraction,
    }
    objective = _objective(kind, args, resumed, file)
    if resumed is not None:
        return replace(resume_record(resumed, given, file), objective=objective)
    if args.lora_alpha is not None and args.lora_rank is None:
        raise ValueError("--lora-alpha is for --lora-rank: tuning every weight has no adapters")
    run = {k: DEFAULTS.get(k) if v is None else v for k, v in given.items()}
    if run["lora_rank"] is not None and run["lora_alpha"] is None:
        run["lora_alpha"] = 2.0 * run["lora_rank"]
    if not 0 < run["val_fraction"] < 1:
        raise ValueError(f"--val-fraction must be in (0, 1), got {run['val_fraction']}")
    return RunRecord(kind=kind, objective=objective, **run)


def _read_lines(kind: str, data: str) -> list[tuple[str, ...]]:
    """The data file's lines: ``(prompt, chosen, rejected)`` for DPO, ``(prompt, target)`` for GRPO."""
    return read_pairs(data) if kind == "grpo" else read_preferences(data)


def _start(args, resumed: RunRecord | None, file: Path):
    """The start model (``--ckpt`` with ``--adapter`` merged in, as on resume the run records), its
    tokenizer, and the record's fields that say which."""
    base, base_file = read_base(args.ckpt, resumed, file)
    adapter = args.adapter if args.adapter is not None or resumed is None else resumed.adapter
    if resumed is not None and (adapter and sha256_of(adapter)) != resumed.adapter_sha256:
        raise ValueError(f"--resume cannot change --adapter: the run in {file} starts from {resumed.adapter}")
    model, tokenizer = start_model(base, base_file, adapter or None, needs_end=True)
    fields = {
        "base": str(base_file.resolve()),
        "base_sha256": base["checksum"],
        "adapter": str(Path(adapter).resolve()) if adapter else None,
        "adapter_sha256": sha256_of(adapter) if adapter else None,
    }
    return model, tokenizer, fields


def _tune_in_folder(kind: str, args, folder: RunFolder) -> int:
    file = folder.checkpoint
    ckpt, resumed = folder.resumed(kind, args.resume, args.force, start=args.ckpt)
    record = _record(kind, args, resumed, file)
    defaults = dict(TUNE_DEFAULTS[kind])
    lr = args.lr if args.lr is not None else defaults.pop("lr")[record.method]
    defaults.pop("lr", None)
    config = resume_config(TrainConfig(**defaults, lr=lr, min_lr=lr / 10), ckpt, training_flags(args), file)
    data, data_sha256 = resumed_file(args.data, resumed, file)
    model, tokenizer, start = _start(args, resumed, file)
    lines = _read_lines(kind, data)
    n_val = max(1, int(len(lines) * record.val_fraction))
    train_lines, val_lines = lines[:-n_val], lines[-n_val:]
    device = pick_device(config.device)
    set_seed(record.seed)
    reference = make_policy(
        model, record.method, rank=record.lora_rank or 4, alpha=record.lora_alpha or 8.0, seed=record.seed
    )
    model.train()
    o, sampling = record.objective, {"seed": record.seed, "device": device}
    if kind == "dpo":
        batches = DPOBatches(
            tokenizer,
            train_lines,
            val_lines,
            config.batch_size,
            reference=reference,
            beta=o["beta"],
            average=o["average"],
            **sampling,
        )
    else:
        batches = GRPOBatches(
            model,
            tokenizer,
            train_lines,
            val_lines,
            config.batch_size,
            reference=reference,
            **{k: o[k] for k in OBJECTIVES["grpo"]},
            **sampling,
        )
    if not ckpt:
        folder.write_tokenizer(tokenizer, args.force)
    record = replace(
        record,
        **start,
        data=str(Path(data).resolve()),
        data_sha256=data_sha256,
        corpus=Path(data).name,
        n_train=len(train_lines),
        n_val=len(val_lines),
        tokenizer_sha256=tokenizer_checksum(tokenizer),
    )
    print(
        f"{Path(data).name}: {len(train_lines)} lines to train on, {len(val_lines)} to validate; {kind} "
        f"({record.method}, {count_parameters(model):,} parameters trained); device {device}"
    )
    try:
        history = train(model, batches, config, tokenizer=tokenizer, meta=record.to_meta(), resume=ckpt or False)
    except KeyboardInterrupt:
        print(f"Interrupted. Continue with: python -m transformer_lib {kind} --resume --out-dir {args.out_dir}")
        return 130
    if history.val_loss and kind == "dpo":
        print(f"final val loss {history.val_loss[-1]:.4f} after {history.eval_step[-1]} steps")
    elif history.val_loss:  # GRPO's evaluation "loss" is 1 - the mean reward
        print(f"final val reward {1 - history.val_loss[-1]:.4f} after {history.eval_step[-1]} steps")
    print(f"checkpoint in {file}")
    return 0
