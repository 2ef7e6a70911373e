"""The command line (chapter 9, "A GPT from scratch"): train a GPT on characters or (chapter 13) on
byte-level BPE tokens, sample from it, and (chapter 15) fine-tune it on prompt/response pairs.

::

    python -m transformer_lib train --preset cpu   # or: transformer-train
    python -m transformer_lib train --resume       # continue out/ckpt.pt
    python -m transformer_lib sample --ckpt out --prompt "ROMEO:"
    python -m transformer_lib finetune --ckpt out --data pairs.jsonl

Every training setting is written once, as a field of :class:`~transformer_lib.train_config.TrainConfig`
(or, for the model's shape, of :class:`~transformer_lib.models.GPTConfig`); the flags are made
from those fields and the presets are values of them. Under ``torchrun`` the command joins the
process group and each rank trains on its own share of every batch.

One module per command, :mod:`.train`, :mod:`.sample` and (chapter 15) :mod:`.finetune`, with
what they share (the parser, the flags and the settings) in :mod:`.settings`; this package reads
the command's name and hands the rest of the arguments to it (:func:`main`). A new command is a
module with its ``*_main(argv)`` and one row of ``COMMANDS``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import NamedTuple

from ..run import TOKENIZER_NAME as TOKENIZER_NAME

# Names that tests, scripts and chapter 9's list of library names read as transformer_lib.cli.NAME
from ..train_config import MODEL_SETTINGS as MODEL_SETTINGS
from ..train_config import PRESETS as PRESETS
from .finetune import finetune_main
from .sample import sample_main
from .settings import model_settings as model_settings
from .train import END_OF_TEXT as END_OF_TEXT
from .train import _compare_replicas as _compare_replicas
from .train import build_parser, train_main

__all__ = ["build_parser", "finetune_main", "main", "sample_main", "train_main"]


class _Command(NamedTuple):
    run: Callable[[Sequence[str] | None], int]  # the arguments after the command's name -> the exit status
    interrupted: str = ""  # what a Ctrl-C outside the training loop adds to "interrupted (Ctrl-C)"


# The subcommands, by the name that comes first on the command line.
COMMANDS = {
    "train": _Command(train_main, "; no checkpoint was written"),
    "sample": _Command(sample_main),
    "finetune": _Command(finetune_main, "; no checkpoint was written"),
}
DEFAULT_COMMAND = "train"  # no command name: the arguments are the training command's


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point (chapter 9): ``sample ...`` generates text from a checkpoint; ``train ...`` (or
    no command) trains; ``finetune ...`` (chapter 15) fine-tunes a checkpoint on prompt/response pairs.

    A bad setting, a missing or unreadable file or a diverging run ends with one line on stderr
    that names the problem, and exit status 2; ``--debug`` shows the Python traceback instead.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    argv = [a for a in argv if a != "--debug"]
    name = argv[0] if argv[:1] and argv[0] in COMMANDS else DEFAULT_COMMAND
    command = COMMANDS[name]
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
