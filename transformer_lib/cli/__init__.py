"""The command line (chapter "A GPT from scratch"): train a GPT on characters or (chapter
"Tokens") on byte-level BPE tokens, sample from it, (chapter "Fine-tuning") fine-tune it on prompt/response pairs, and
export it in Hugging Face's format.

::

    python -m transformer_lib                     # the commands (nothing runs)
    python -m transformer_lib train --preset cpu  # or: transformer-train ...
    python -m transformer_lib train --resume      # continue out/ckpt.pt
    python -m transformer_lib sample --ckpt out --prompt "ROMEO:"
    python -m transformer_lib finetune --ckpt out --data pairs.jsonl
    python -m transformer_lib export --ckpt out --out-dir hf
    python -m transformer_lib evaluate --ckpt out --compare out/finetune
    python -m transformer_lib grpo --ckpt out --data pairs.jsonl --lora-rank 4

Every training setting is written once, as a field of :class:`~transformer_lib.train_config.TrainConfig`
(or, for the model's shape, of :class:`~transformer_lib.models.GPTConfig`); the flags are made
from those fields and the presets are values of them. Under ``torchrun`` the command joins the
process group and each rank trains on its own share of every batch.

One module per command, :mod:`.train`, :mod:`.sample`, (chapter "Fine-tuning") :mod:`.finetune`, :mod:`.export`,
(chapter "Measuring a model") :mod:`.evaluate` and (chapter "Preferences and rewards") :mod:`.tune` (``dpo`` and
``grpo``), with what they share (the parser, the flags and the settings) in :mod:`.settings`; this package reads
the command's name and hands the rest of the arguments to it (:func:`main`). A new command is a
module with its ``*_main(argv)`` and one row of ``COMMANDS``.

With no arguments the command prints the list of commands and exits with status 2 (nothing is
trained unless asked); ``--help``, ``-h`` and ``help`` print the same list and exit 0, and ``help
COMMAND`` shows that command's flags. Arguments that start with a flag (``--preset cpu ...``) are
the training command's, as in earlier versions; an unknown command name is refused with the
nearest one.
"""

from __future__ import annotations

import difflib
import sys
from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch

from ..run import TOKENIZER_NAME as TOKENIZER_NAME

# Names that tests, scripts and chapter "A GPT from scratch"'s list of library names read as transformer_lib.cli.NAME
from ..train_config import MODEL_SETTINGS as MODEL_SETTINGS
from ..train_config import PRESETS as PRESETS
from .evaluate import evaluate_main
from .export import export_main
from .finetune import finetune_main
from .sample import sample_main
from .settings import model_settings as model_settings
from .train import END_OF_TEXT as END_OF_TEXT
from .train import _compare_replicas as _compare_replicas
from .train import build_parser, train_main
from .tune import dpo_main, grpo_main

__all__ = [
    "build_parser",
    "dpo_main",
    "evaluate_main",
    "export_main",
    "finetune_main",
    "grpo_main",
    "main",
    "sample_main",
    "train_main",
]


class _Command(NamedTuple):
    run: Callable[[Sequence[str] | None], int]  # the arguments after the command's name -> the exit status
    about: str  # one line for the list of commands
    interrupted: str = ""  # what a Ctrl-C outside the training loop adds to "interrupted (Ctrl-C)"


# The subcommands, by the name that comes first on the command line.
COMMANDS = {
    "train": _Command(
        train_main,
        "train a GPT on Tiny Shakespeare or your text, characters or BPE tokens (ch. 9, 13)",
        "; no checkpoint was written",
    ),
    "sample": _Command(sample_main, "generate text from a run, or a fine-tuned model's answer to --prompt (ch. 9, 15)"),
    "finetune": _Command(
        finetune_main,
        "fine-tune a BPE run on prompt/response pairs, every weight or LoRA (ch. 15)",
        "; no checkpoint was written",
    ),
    "export": _Command(
        export_main, "write a run for Hugging Face transformers (GPT-2, Llama or Mixtral), LoRA for peft"
    ),
    "evaluate": _Command(
        evaluate_main,
        "a run's report card: loss, bits per byte, multiple choice, exact match and pass@k, with intervals; "
        "two runs side by side (ch. 16)",
    ),
    "dpo": _Command(
        dpo_main,
        "tune a run on chosen/rejected answer pairs, DPO, every weight or LoRA (ch. 17)",
        "; no checkpoint was written",
    ),
    "grpo": _Command(
        grpo_main, "tune a run on rewards of its own sampled answers, GRPO (ch. 17)", "; no checkpoint was written"
    ),
}
DEFAULT_COMMAND = "train"  # arguments that start with a flag are the training command's
HELP = ("help", "-h", "--help")


def overview() -> str:
    """The list of commands that ``python -m transformer_lib`` and its ``--help`` print (chapter "A GPT from
    scratch")."""
    rows = [f"  {name:<9} {command.about}" for name, command in COMMANDS.items()]
    return "\n".join(
        [
            "usage: python -m transformer_lib COMMAND [flags]",
            "",
            'The command line of "Attention, Executed": train, sample, fine-tune, export and evaluate small GPTs.',
            "",
            "commands:",
            *rows,
            f"  {'help':<9} this list; help COMMAND (or COMMAND --help) lists a command's flags and their defaults",
            "",
            "a first run, about 15 seconds on one CPU thread (the full --preset cpu run of 2,000 steps: "
            "about 2 minutes):",
            "  python -m transformer_lib train --preset cpu --max-iters 200 --out-dir out/first",
            "  python -m transformer_lib sample --ckpt out/first --prompt ROMEO:",
        ]
    )


def _unknown(name: str) -> int:
    near = difflib.get_close_matches(name, [*COMMANDS, "help"], n=1)
    hint = f"; did you mean {near[0]!r}?" if near else ""
    print(f"error: unknown command {name!r}{hint} (the commands: {', '.join(COMMANDS)}, help)", file=sys.stderr)
    return 2


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point (chapter "A GPT from scratch"): ``train ...`` trains (as do arguments that start with a flag);
    ``sample ...`` generates text from a checkpoint; ``finetune ...`` (chapter "Fine-tuning") fine-tunes a
    checkpoint on prompt/response pairs; ``export ...`` writes a run in Hugging Face's format. No
    arguments, ``help`` or ``--help`` print the commands (no arguments: exit status 2).

    A bad setting, a missing or unreadable file or a diverging run ends with one line on stderr
    that names the problem, and exit status 2; ``--debug`` shows the Python traceback instead.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    argv = [a for a in argv if a != "--debug"]
    if not argv:
        print(overview())
        print("error: give a command (nothing was run)", file=sys.stderr)
        return 2
    if argv[0] in HELP:
        if argv[1:2] and argv[1] in COMMANDS:
            return COMMANDS[argv[1]].run(["--help"])
        if argv[1:2]:
            return _unknown(argv[1])
        print(overview())
        return 0
    if argv[0] not in COMMANDS and not argv[0].startswith("-"):
        return _unknown(argv[0])
    name = argv[0] if argv[0] in COMMANDS else DEFAULT_COMMAND
    command = COMMANDS[name]
    threads = torch.get_num_threads()  # --threads (default 1) holds for this command only
    try:
        return command.run(argv[1:] if argv[:1] == [name] else argv)
    except KeyboardInterrupt:  # a Ctrl-C outside the training loop (which saves and says how to resume)
        if debug:
            raise
        print(f"interrupted (Ctrl-C){command.interrupted}", file=sys.stderr)
        return 130
    except (ValueError, TypeError, OSError, FloatingPointError, RuntimeError) as e:
        if debug:
            raise
        message = " ".join(str(e).split()) or type(e).__name__
        print(f"error: {message} (run with --debug for the traceback)", file=sys.stderr)
        return 2
    finally:
        torch.set_num_threads(threads)
