"""The command line's flags and settings (chapter 9): the parser every command uses, the flags
made from the fields of :class:`~transformer_lib.models.GPTConfig` and
:class:`~transformer_lib.train_config.TrainConfig`, what ``python -m transformer_lib train`` takes
from its preset, its flags and, with ``--resume``, from the checkpoint it continues; and the
flags it refuses before anything is read or written (an empty ``--out-dir``, contradictory
flags, a seed out of range). The commands themselves are in :mod:`transformer_lib.cli`.
"""

from __future__ import annotations

import argparse
from dataclasses import fields, replace
from pathlib import Path

import torch

from ..checkpoint import CHECKPOINT_NAME, check_recorded
from ..models import GPT_CHOICES, GPTConfig
from ..train import _PROCESS_SETTINGS
from ..train_config import MODEL_SETTINGS, PRESETS, TrainConfig
from ..utils import DTYPES, check_fields, pick_device

# TrainConfig fields that describe this process rather than the run: never taken from a checkpoint.
_RUNTIME = _PROCESS_SETTINGS
_SHAPE_RULES = {"n_layers": (int, "positive"), "n_heads": (int, "positive"), "d_model": (int, "positive"),
                "context_len": (int, "positive"), "dropout": (float, "probability")}  # fmt: skip
_TYPES = {"int": int, "float": float, "str": str}  # a dataclass field's type, as written, to argparse's


class _Parser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line on stderr and exit status 2 (argparse
    prints the usage too), like every other error of the command."""

    def error(self, message: str) -> None:
        self.exit(2, f"{self.prog}: error: {message}\n")


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _add_setting_flags(parser: argparse.ArgumentParser, shape: bool = True, defaults: str = "the preset's") -> None:
    """One flag per GPTConfig shape setting (unless not ``shape``) and per TrainConfig field, default
    None (= ``defaults``, or the checkpoint's with --resume)."""
    if shape:
        group = parser.add_argument_group("model (default: the preset's, or the checkpoint's with --resume)")
        model_types = {f.name: f.type for f in fields(GPTConfig)}
        for name, help_ in MODEL_SETTINGS.items():
            _add_flag(group, name, model_types[name], help_, GPT_CHOICES.get(name))
    group = parser.add_argument_group(f"training (default: {defaults}, or the checkpoint's with --resume)")
    for f in fields(TrainConfig):
        if f.name != "out_dir":
            choices = ["auto", *DTYPES] if f.name == "dtype" else None
            _add_flag(group, f.name, f.type, f.metadata["help"], choices)


def _add_flag(group, name: str, type_: str, help_: str, choices=None) -> None:
    """``--name`` for a dataclass field of type ``type_`` (as written): ``--name/--no-name`` for a bool."""
    kind = type_.split("|")[0].strip()
    if kind == "bool":
        group.add_argument(_flag(name), action=argparse.BooleanOptionalAction, default=None, help=help_)
    else:
        group.add_argument(_flag(name), type=_TYPES[kind], default=None, choices=choices, help=help_)


def _settings(args, ckpt: dict | None, file: Path) -> tuple[str, dict, TrainConfig]:
    """The model's shape and the TrainConfig: the preset's, then the checkpoint's, then the flags'.

    On resume the model's shape is the checkpoint's (a different one is refused); a changed
    training setting takes effect from the next step (see :func:`~transformer_lib.train.train`).
    """
    preset = args.preset or ("gpu" if torch.cuda.is_available() else "cpu")
    shape_changes, config = PRESETS[preset]
    defaults = GPTConfig(vocab_size=1)
    shape = {name: shape_changes.get(name, getattr(defaults, name)) for name in MODEL_SETTINGS}
    given_shape = {k: getattr(args, k) for k in MODEL_SETTINGS if getattr(args, k) is not None}
    if ckpt is not None:
        shape = {k: ckpt["model_config"].get(k, getattr(defaults, k)) for k in MODEL_SETTINGS}  # older: defaults
        changed = [k for k, v in given_shape.items() if v != shape[k]]
        if changed:
            k = changed[0]
            raise ValueError(
                f"--resume cannot change the model's shape: the run in {file} has {_flag(k)} {shape[k]}, "
                f"not {given_shape[k]}"
            )
    shape.update(given_shape)
    check_fields(GPTConfig(vocab_size=1, **shape), _SHAPE_RULES)
    return preset, shape, _train_config(args, config, ckpt, file)  # out_dir: --out-dir, default "out"


def _train_config(args, config: TrainConfig, ckpt: dict | None, file: Path) -> TrainConfig:
    """``config`` (the defaults), then on resume the checkpoint's settings, then the flags given."""
    if ckpt is not None:
        saved = {k: v for k, v in (ckpt.get("train_config") or {}).items() if k not in _RUNTIME}
        names = {f.name for f in fields(TrainConfig)} - _RUNTIME
        missing, unknown = sorted(names - set(saved)), sorted(set(saved) - names)
        if missing or unknown:
            what = f"does not record the training setting {_flag(missing[0])}" if missing else (
                f"records the training setting {unknown[0]!r}, which this version does not know")  # fmt: skip
            raise ValueError(f"{file} {what} (a checkpoint from another version?)")
        config = replace(config, **saved, **_recorded_process(ckpt, args, file))
    given = {f.name: getattr(args, f.name) for f in fields(TrainConfig) if getattr(args, f.name) is not None}
    return replace(config, **given)


def _recorded_process(ckpt: dict, args, file: Path) -> dict:
    """On resume, the device, autocast dtype and compilation the run was started with, unless a
    flag gives another (a run can move to another machine that way): ``auto`` would otherwise
    pick a GPU for a run that trained on the CPU. A device this machine lacks is refused."""
    saved = ckpt.get("train_config") or {}
    kept = {k: saved[k] for k in ("device", "dtype", "compile") if k in saved and getattr(args, k) is None}
    if "device" in kept:
        try:
            pick_device(str(kept["device"]))
        except (ValueError, RuntimeError):
            raise ValueError(
                f"the run in {file} trained on device {kept['device']!r}, which this machine does not have: "
                f"continue it here with --device cpu (or another device)"
            ) from None
    return kept


# Settings of the command itself (not of TrainConfig), recorded in the checkpoint's meta.
_RUN_DEFAULTS = {"seed": 1337, "val_fraction": 0.1, "tokenizer": "char", "vocab_size": None}
BPE_VOCAB_DEFAULT = 512  # --tokenizer bpe without --vocab-size


def _run_settings(args, ckpt: dict | None, file: Path) -> dict:
    """``--preset``, ``--seed``, ``--val-fraction``, ``--tokenizer`` and ``--vocab-size``: the flags'
    (or the defaults), or on resume the checkpoint's; a flag that differs from the checkpoint is
    refused, as is a split the checkpoint does not record."""
    given = {"preset": args.preset, "seed": args.seed, "val_fraction": args.val_fraction,
             "tokenizer": args.tokenizer, "vocab_size": args.vocab_size}  # fmt: skip
    if ckpt is None:
        out = {k: _RUN_DEFAULTS.get(k) if v is None else v for k, v in given.items()}
        if out["tokenizer"] == "char" and out["vocab_size"] is not None:
            raise ValueError(
                f"--vocab-size {out['vocab_size']} is for --tokenizer bpe: a character tokenizer's vocabulary is the "
                f"text's characters"
            )
        if out["tokenizer"] == "bpe":
            out["vocab_size"] = BPE_VOCAB_DEFAULT if out["vocab_size"] is None else out["vocab_size"]
            if out["vocab_size"] < 258:
                raise ValueError(
                    f"--vocab-size must be at least 258 (the 256 bytes, one merge and <|endoftext|>), "
                    f"got {out['vocab_size']}"
                )
        return out
    meta, out = ckpt.get("meta") or {}, {}
    for name, value in given.items():
        recorded = meta.get(name)
        if recorded is None:
            if value is None and name == "val_fraction":
                raise ValueError(
                    f"{file} does not record which fraction of the text was kept for validation: give the run's "
                    f"--val-fraction"
                )
            out[name] = _RUN_DEFAULTS.get(name) if value is None else value
        elif value is not None and value != recorded:
            raise _changed(name, recorded, value, file)
        else:
            out[name] = recorded
    return out


def _changed(name: str, recorded, value, file: Path) -> ValueError:
    """The refusal of a flag that ``--resume`` was given with another value than the run in ``file`` records."""
    return ValueError(f"--resume cannot change {_flag(name)}: the run in {file} uses {recorded}, not {value}")


def _data_path(args, ckpt: dict | None, file: Path) -> str | None:
    """The text to train on: ``--data``, or on resume the file the checkpoint names."""
    if args.data is not None or ckpt is None:
        return args.data
    meta = ckpt.get("meta") or {}
    if meta.get("data_from"):
        raise ValueError(
            f"the run in {file} read its training text from {meta['data_from']}, which cannot be read again: "
            f"give the same text with --data FILE"
        )
    if meta.get("data") and not Path(meta["data"]).is_file():
        raise ValueError(
            f"the run in {file} was trained on {meta['data']}, which is no longer there: give the same text "
            f"with --data FILE"
        )
    return meta.get("data")


def _resumable(ckpt: dict, file: Path, data: str | None) -> dict:
    """``ckpt`` if this command can continue it, else a ``ValueError`` that says why."""
    check_recorded(ckpt, file, ("model_class",))
    if ckpt.get("model_class") != "GPT" or not ckpt.get("model_config") or not ckpt.get("tokenizer"):
        raise ValueError(
            f"{file} holds a {ckpt.get('model_class')} "
            f"{'with' if ckpt.get('tokenizer') else 'without'} its tokenizer: --resume continues only a GPT saved "
            f"with its tokenizer (train(..., tokenizer=...) or this command)"
        )
    check_recorded(ckpt, file)
    if data is None and not (ckpt.get("meta") or {}).get("corpus"):
        raise ValueError(f"{file} does not say which text it was trained on: give it with --data")
    return ckpt


def _check_seed(seed: int | None) -> None:
    if seed is not None and not 0 <= seed < 2**32:
        raise ValueError(f"--seed must be an int in [0, {2**32 - 1}], got {seed}")


# Flags that cannot both be given: (flag, flag, why), the attribute names of the parsed arguments.
_CONTRADICTIONS = (("resume", "force", "--resume continues the run in OUT_DIR, --force replaces it: give one of them"),)


def _check_flags(args) -> None:
    """Refuse an empty ``--out-dir`` (an unset shell variable would train a model and save it
    nowhere) and contradictory flags, before anything is read or written."""
    if not args.out_dir.strip():
        raise ValueError(
            f"--out-dir is empty ({args.out_dir!r}; an unset shell variable?): give the folder for {CHECKPOINT_NAME}, "
            f"for example --out-dir out"
        )
    for first, second, why in _CONTRADICTIONS:
        if getattr(args, first) and getattr(args, second):
            raise ValueError(f"{_flag(first)} and {_flag(second)} contradict each other: {why}")


def _parse(parser: argparse.ArgumentParser, argv) -> tuple[argparse.Namespace, Path]:
    """The flags of a training command (train or finetune), checked, and its checkpoint's path;
    ``--resume`` without a checkpoint there is a usage error."""
    args = parser.parse_args(argv)
    _check_flags(args)
    file = Path(args.out_dir) / CHECKPOINT_NAME
    if args.resume and not file.is_file():
        parser.error(f"--resume: no checkpoint at {file}")
    return args, file
