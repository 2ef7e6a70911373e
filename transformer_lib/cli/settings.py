"""The command line's flags and settings (chapter "A GPT from scratch"): the parser every command uses, the flags
made from the fields of :class:`~transformer_lib.models.GPTConfig` and
:class:`~transformer_lib.train_config.TrainConfig`, what ``python -m transformer_lib train`` takes
from its preset, its flags and, with ``--resume``, from the checkpoint it continues (by the rules
of :mod:`transformer_lib.run`, which owns the run folder and its record); and the flags it
refuses before anything is read or written (an empty ``--out-dir``, contradictory flags, a seed
out of range). The commands themselves are in :mod:`transformer_lib.cli`.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from contextlib import contextmanager
from dataclasses import fields
from pathlib import Path

import torch

from ..experts import SCORES
from ..models import GPT, GPTConfig
from ..recipe import FLAT_CHOICES as RECIPE_CHOICES
from ..recipe import FLAT_TYPES as RECIPE_TYPES
from ..recipe import RECIPES
from ..resume import flag as _flag
from ..resume import resume_config, resume_record
from ..rope_scaling import ROPE_KINDS
from ..run import CHECKPOINT_NAME, DEFAULTS, RunFolder, RunRecord
from ..train_config import MODEL_SETTINGS, PRESETS, TrainConfig
from ..utils import DTYPES, check_fields

_SHAPE_RULES = {
    "n_layers": (int, "positive"),
    "n_heads": (int, "positive"),
    "d_model": (int, "positive"),
    "context_len": (int, "positive"),
    "dropout": (float, "probability"),
}
EXPERTS_CHOICES = {"experts_score": list(SCORES), "rope_scaling": [k for k in ROPE_KINDS if k != "dynamic"]}
_TYPES = {"int": int, "float": float, "str": str}  # a dataclass field's type, as written, to argparse's


THREADS_HELP = "PyTorch threads; 1 is fastest on a busy laptop (default: 1)"


class Parser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line on stderr, ``error: ... (PROG --help lists the
    flags)``, and exit status 2 (argparse prints the usage too), in the form of every other error of the
    command line; an unknown flag is answered with the nearest known one.

    What every command gets from it: ``--threads N`` (default 1), which :meth:`parse_args` hands to
    ``torch.set_num_threads``; a flag spelt with underscores (``--learning_rate``, as Hugging
    Face's scripts write them) read as the known flag with dashes; no abbreviated flag
    (``--max-iter`` is an unknown flag, not ``--max-iters``); and ``refused``, flags that would mean
    something else here, each refused with its sentence before anything is parsed.
    """

    def __init__(self, *args, refused: dict[str, str] | None = None, **kwargs) -> None:
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)
        self.refused = dict(refused or {})  # flag -> why it is refused here
        self.add_argument("--threads", type=int, default=1, metavar="N", help=THREADS_HELP)

    def error(self, message: str) -> None:
        self.exit(2, f"error: {message} ({self.prog} --help lists the flags)\n")

    def parse_args(self, args=None, namespace=None):
        args = self.dashed(sys.argv[1:] if args is None else list(args))
        for a in args:
            if a == "--":
                break
            if a.split("=")[0] in self.refused:
                self.error(f"{a.split('=')[0]} {self.refused[a.split('=')[0]]}")
        parsed, extra = self.parse_known_args(args, namespace)
        if extra:
            self.error(self._unrecognized(extra))
        if parsed.threads < 1:
            self.error(f"--threads must be a positive int, got {parsed.threads}")
        torch.set_num_threads(parsed.threads)
        return parsed

    def dashed(self, argv: list[str]) -> list[str]:
        """``argv`` with each ``--a_b`` (or ``--a_b=v``) that is a known or refused flag once its
        underscores are dashes written ``--a-b``; arguments after ``--`` are left as they are."""
        known = {o for action in self._actions for o in action.option_strings} | set(self.refused)
        out = []
        for i, a in enumerate(argv):
            if a == "--":
                return out + argv[i:]
            name, eq, value = a.partition("=")
            if name.startswith("--") and "_" in name and name not in known and name.replace("_", "-") in known:
                a = name.replace("_", "-") + eq + value
            out.append(a)
        return out

    def _unrecognized(self, extra: list[str]) -> str:
        """What to say of arguments no flag takes: the first unknown flag and the nearest known one."""
        flag = next((a.split("=")[0] for a in extra if a.startswith("-")), None)
        if flag is None:
            return f"unrecognized arguments: {' '.join(extra)} (see {self.prog} --help)"
        known = [o for action in self._actions for o in action.option_strings if o.startswith("--")]
        near = difflib.get_close_matches(flag, known, n=1, cutoff=0.6)
        return f"unknown flag {flag}" + (f"; did you mean {near[0]}?" if near else f" (see {self.prog} --help)")


#: The names Hugging Face's trainer and peft give some settings, accepted as the same flags.
ALIASES = {
    "max_iters": ("--max-steps",),
    "lr": ("--learning-rate",),
    "warmup_iters": ("--warmup-steps",),
    "batch_size": ("--per-device-train-batch-size",),
    "out_dir": ("--output-dir",),
    "lora_rank": ("--lora-r",),
    "log_interval": ("--logging-steps",),
    "eval_interval": ("--eval-steps",),
    "grad_clip": ("--max-grad-norm",),
    "beta1": ("--adam-beta1",),
    "beta2": ("--adam-beta2",),
}


def flags_of(name: str) -> tuple[str, ...]:
    """The flag of the setting ``name`` and its aliases: ``lr`` -> ``("--lr", "--learning-rate")``."""
    return (_flag(name), *ALIASES.get(name, ()))


def _shown(value) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    return f"{value:g}" if isinstance(value, float) else str(value)


def _preset_defaults(values: dict[str, object]) -> str:
    """``(default: V)`` from ``{preset: value}``, or each preset's value where they differ."""
    if len({repr(v) for v in values.values()}) == 1:
        return f"(default: {_shown(values['cpu'])})"
    by_preset = [
        f"{_shown(v)} with --preset {k}" if i == 0 else f"{_shown(v)} with {k}"
        for i, (k, v) in enumerate(values.items())
    ]
    return f"(default: {', '.join(by_preset)})"


def _with_default(help_: str, shown: str | None) -> str:
    """``help_`` ending with its default, unless it already says it."""
    return help_ if shown is None or "(default" in help_ else f"{help_} {shown}"


def add_setting_flags(
    parser: argparse.ArgumentParser, shape: bool = True, defaults: str | dict = "the preset's"
) -> None:
    """One flag per GPTConfig shape setting (unless not ``shape``) and per TrainConfig field, default
    None (= ``defaults``, or the checkpoint's with --resume). Each flag's help ends with its default:
    the presets' values, or with ``defaults`` a dict ``{field: value}`` (a command's own defaults)
    those values and :class:`TrainConfig`'s for the rest."""
    if shape:
        group = parser.add_argument_group("model (default: the preset's, or the checkpoint's with --resume)")
        model_types = {f.name: f.type for f in fields(GPTConfig)}
        model_types.update(RECIPE_TYPES)  # the recipe's choices, from its specs' fields
        base = GPTConfig(vocab_size=1).settings()
        group.add_argument(
            "--recipe",
            choices=sorted(RECIPES),
            default=None,
            help="start from a named block recipe (its choices replace the preset's; the flags below change them)",
        )
        for name, help_ in MODEL_SETTINGS.items():
            values = {k: changes.get(name, base[name]) for k, (changes, _) in PRESETS.items()}
            shown = None if None in values.values() else _preset_defaults(values)
            choices = RECIPE_CHOICES.get(name, EXPERTS_CHOICES.get(name))
            _add_flag(group, name, model_types[name], _with_default(help_, shown), choices)
    title = defaults if isinstance(defaults, str) else "the command's"
    group = parser.add_argument_group(f"training (default: {title}, or the checkpoint's with --resume)")
    for f in fields(TrainConfig):
        if f.name != "out_dir":
            choices = ["auto", *DTYPES] if f.name == "dtype" else None
            if isinstance(defaults, dict):
                value = defaults.get(f.name, f.default)
                shown = None if value is None else f"(default: {_shown(value)})"
            else:
                values = {k: getattr(config, f.name) for k, (_, config) in PRESETS.items()}
                shown = None if None in values.values() else _preset_defaults(values)
            refused = getattr(parser, "refused", {})
            _add_flag(group, f.name, f.type, _with_default(f.metadata["help"], shown), choices, refused)


def _add_flag(group, name: str, type_: str, help_: str, choices=None, refused=()) -> None:
    """``--name`` (and its :data:`ALIASES`, but those in ``refused``) for a dataclass field of type
    ``type_`` (as written): ``--name/--no-name`` for a bool."""
    kind = type_.split("|")[0].strip()
    if kind == "bool":
        group.add_argument(_flag(name), action=argparse.BooleanOptionalAction, default=None, help=help_)
    else:
        names = [f for f in flags_of(name) if f not in refused]
        group.add_argument(*names, dest=name, type=_TYPES[kind], default=None, choices=choices, help=help_)


def model_settings(args, ckpt: dict | None, file: Path) -> tuple[str, dict, TrainConfig]:
    """The model's shape and the TrainConfig: the preset's, then the checkpoint's, then the flags'.

    On resume the model's shape is the checkpoint's (a different one is refused); a changed
    training setting takes effect from the next step (see :func:`~transformer_lib.train.train`).
    """
    preset = args.preset or ("gpu" if torch.cuda.is_available() else "cpu")
    shape_changes, config = PRESETS[preset]
    defaults = GPTConfig(vocab_size=1).settings()
    shape = {name: shape_changes.get(name, defaults[name]) for name in MODEL_SETTINGS}
    given_shape = {k: getattr(args, k) for k in MODEL_SETTINGS if getattr(args, k) is not None}
    if getattr(args, "recipe", None) is not None:  # a named recipe's choices, then the flags that change them
        named = GPTConfig(vocab_size=1, recipe=args.recipe).settings()
        given_shape = {**{k: named[k] for k in RECIPE_TYPES}, **given_shape}
    if ckpt is not None:
        recorded = GPTConfig(**ckpt["model_config"]).settings()  # any version's: flat or with its recipe
        shape = {k: recorded[k] for k in MODEL_SETTINGS}
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


def check_model_shape(shape: dict, given: dict) -> None:
    """Build the model of ``shape`` (the settings by name) without memory, on the meta device, so that
    a shape the model refuses is refused before any folder is made; a setting the user never gave
    that the given ones made impossible is refused by those flags (``given``: the flags as given,
    None where not)."""
    try:
        with torch.device("meta"):
            GPT(GPTConfig(vocab_size=2, **shape))
    except ValueError as e:
        if str(e).startswith("rope_dim must be even") and given.get("rope_dim") is None:
            d_model, n_heads = shape["d_model"], shape["n_heads"]
            raise ValueError(
                f"--attention latent with --positions rotary keeps a rotary part of each head, by default the even "
                f"part of half a head, and --d-model {d_model} with --n-heads {n_heads} makes heads "
                f"{d_model // n_heads} wide, so that part is {2 * (d_model // n_heads // 4)}: raise --d-model to at "
                f"least {4 * n_heads}, lower --n-heads to at most {max(1, d_model // 4)}, or give an even --rope-dim"
            ) from None
        raise
    except (NotImplementedError, RuntimeError):  # a part that cannot be made on the meta device: built later
        pass


def _train_config(args, config: TrainConfig, ckpt: dict | None, file: Path) -> TrainConfig:
    """``config`` (the defaults), then on resume the checkpoint's settings, then the flags given
    (:func:`~transformer_lib.resume.resume_config`)."""
    return resume_config(config, ckpt, training_flags(args), file)


def training_flags(args) -> dict:
    """The TrainConfig flags as given, by field (None: not given)."""
    return {f.name: getattr(args, f.name) for f in fields(TrainConfig)}


BPE_VOCAB_DEFAULT = 512  # --tokenizer bpe without --vocab-size


def pretrain_record(args, resumed: RunRecord | None, file: Path) -> RunRecord:
    """What a pretraining run is, as far as its flags say: ``--preset``, ``--seed``,
    ``--val-fraction``, ``--tokenizer`` and ``--vocab-size`` (or their defaults), or on resume the
    run's, a flag that differs refused (``resume.resume_record``)."""
    given = {
        "preset": args.preset,
        "seed": args.seed,
        "val_fraction": args.val_fraction,
        "tokenizer": args.tokenizer,
        "vocab_size": args.vocab_size,
    }
    if resumed is not None:
        return resume_record(resumed, given, file)
    out = {k: DEFAULTS.get(k) if v is None else v for k, v in given.items()}
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
    return RunRecord(kind="pretrain", **out)


def check_seed(seed: int | None) -> None:
    """Refuse a ``--seed`` that NumPy cannot take."""
    if seed is not None and not 0 <= seed < 2**32:
        raise ValueError(f"--seed must be an int in [0, {2**32 - 1}], got {seed}")


# Flags that cannot both be given: (flag, flag, why), the attribute names of the parsed arguments.
_CONTRADICTIONS = (("resume", "force", "--resume continues the run in OUT_DIR, --force replaces it: give one of them"),)


def check_lora_flags(args) -> None:
    """``--lora-rank`` a positive int and ``--lora-alpha`` a positive number, where given
    (the ``finetune`` command of chapter "Fine-tuning", ``dpo`` and ``grpo`` of chapter "Preferences and rewards")."""
    if args.lora_rank is not None and args.lora_rank < 1:
        raise ValueError(f"--lora-rank must be a positive int, got {args.lora_rank}")
    if args.lora_alpha is not None and not args.lora_alpha > 0:
        raise ValueError(f"--lora-alpha must be a positive number, got {args.lora_alpha:g}")


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


def parse_run_flags(parser: argparse.ArgumentParser, argv) -> tuple[argparse.Namespace, RunFolder]:
    """The flags of a training command (train or finetune), checked, and its run folder;
    ``--resume`` without a checkpoint there is a usage error."""
    args = parser.parse_args(argv)
    _check_flags(args)
    run = RunFolder(args.out_dir)
    if args.resume and not run.checkpoint.is_file():
        parser.error(f"--resume: no checkpoint at {run.checkpoint}")
    return args, run


@contextmanager
def owned_run_folder(folder: RunFolder):
    """``with owned_run_folder(folder):`` as ``folder.own()``, and a run refused or failed before it
    wrote anything leaves no folder behind: the folders this call made (``--out-dir`` and any
    missing parents) are removed again when they are still empty."""
    made, path = [], folder.path.absolute()
    while not path.exists() and path != path.parent:
        made.append(path)
        path = path.parent
    try:
        with folder.own():
            yield
    except BaseException:
        for path in made:  # the deepest first
            if path.is_dir() and not any(path.iterdir()):
                path.rmdir()
        raise
