"""A chapter's recorded experiment (chapters 8-19, "Experts" and after): the runs over several seeds
whose results a chapter reads rather than trains live, one module per chapter (``ch08`` ... ``ch19``;
from chapter "Experts" on, named by the chapter's name: ``experts``) and one
recorder (:mod:`.recorder`) that runs, merges and writes them all the same way.

A notebook reads a record with :func:`recorded`::

    from transformer_lib.experiments import recorded

    sweep = recorded("ch14")  # transformer_lib/data/ch14/block_sweep.json

and the command line re-runs a part of one (``--dry-run`` prints and writes nothing)::

    python -m transformer_lib.experiments ch14 --parts lr --seeds 0 --dry-run

``import transformer_lib`` does not import this package.
"""

from importlib import import_module

from .recorder import RECORDS, Experiment, Part, merge, record_path, recorded, run_experiment, write_record

__all__ = [
    "RECORDS",
    "Experiment",
    "Part",
    "experiment",
    "main",
    "merge",
    "record_path",
    "recorded",
    "run_experiment",
    "write_record",
]


def experiment(chapter: str) -> Experiment:
    """The :class:`Experiment` of ``chapter`` (``"ch08"`` ... ``"ch19"``, ``"experts"``, ...), from its
    module (chapter 12)."""
    record_path(chapter)  # an unknown chapter: one sentence naming the known ones
    return import_module(f".{chapter}", __name__).EXPERIMENT


def main(argv: list[str] | None = None) -> int:
    """``python -m transformer_lib.experiments CHAPTER [--parts ...] [--seeds ...] [--steps N]
    [--dry-run] [--out FILE [--force]]`` (chapter 12). A bad request is one line on stderr and exit
    status 2, before any training; so is an ``--out`` file that is not a record of the chapter
    (``--force`` replaces it)."""
    import argparse

    class Parser(argparse.ArgumentParser):
        def error(self, message: str) -> None:  # one line, not the usage block
            self.exit(2, f"error: {message} ({self.prog} --help lists the flags)\n")

    parser = Parser(
        prog="python -m transformer_lib.experiments",
        description="Re-run a chapter's recorded experiment, or a part of it, and merge it into its record.",
    )
    parser.add_argument("chapter", help=f"whose experiment: {', '.join(RECORDS)}")
    parser.add_argument("--parts", nargs="+", default=None, help="run only these parts (default: all)")
    parser.add_argument("--seeds", type=int, nargs="+", default=None, help="run only these seeds of each part")
    parser.add_argument("--steps", type=int, default=None, help="training steps: a smoke run (needs --dry-run)")
    parser.add_argument("--dry-run", action="store_true", help="run and print, write nothing")
    parser.add_argument("--out", default=None, help="the record to update (default: the chapter's shipped one)")
    parser.add_argument(
        "--force", action="store_true", help="replace a file at --out that is not a record of this chapter"
    )
    args = parser.parse_args(argv)
    try:
        chosen = experiment(args.chapter)
        from .recorder import check_out, check_request

        check_request(chosen, args.parts, args.seeds, args.steps, args.dry_run)
        check_out(chosen, args.out, args.force)
    except ValueError as e:
        parser.error(str(e))
    run_experiment(chosen, args.parts, args.seeds, args.steps, args.dry_run, args.out, args.force)
    if args.dry_run:
        print("a dry run: nothing written")
    return 0
