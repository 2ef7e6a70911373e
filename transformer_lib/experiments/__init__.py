r"""A chapter's recorded experiment: the runs over several seeds whose results a chapter reads
rather than trains live, one module per chapter, named by the chapter's slug
(:mod:`transformer_lib.chapters`: ``todays_block`` for chapter "Today's block"), and one recorder
(:mod:`.recorder`) that runs, merges and writes them all the same way.

A notebook reads a record with :func:`recorded`::

    from transformer_lib.experiments import recorded

    sweep = recorded("todays_block")  # the record of chapter "Today's block"

and the command line re-runs a part of one (``--dry-run`` prints and writes nothing)::

    python -m transformer_lib.experiments todays_block \
        --parts lr --seeds 0 --dry-run

``import transformer_lib`` does not import this package. The modules' and records' old names, by
the chapters' numbers (``transformer_lib.experiments.ch14``, ``recorded("ch14")``), still work:
an old module name imports the same module as its slug.
"""

import sys
from importlib import import_module
from importlib.abc import Loader, MetaPathFinder
from importlib.util import spec_from_loader

from ..chapters import OLD_NAMES, slug
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


class _OldNames(MetaPathFinder, Loader):
    """Imports ``transformer_lib.experiments.ch14`` (or ``ch15_diagnosis``) as the module of its
    slug (``todays_block``, ``fine_tuning_diagnosis``): the same module object, under both names."""

    def find_spec(self, fullname, path=None, target=None):
        package, _, name = fullname.rpartition(".")
        old, _, rest = name.partition("_")
        if package != __name__ or old not in OLD_NAMES:
            return None
        return spec_from_loader(fullname, self)

    def create_module(self, spec):
        package, _, name = spec.name.rpartition(".")
        old, _, rest = name.partition("_")
        module = import_module(f"{package}.{OLD_NAMES[old]}{'_' + rest if rest else ''}")
        self.spec = module.__spec__  # the import system writes the old name's spec over it
        return module

    def exec_module(self, module):
        module.__spec__ = self.spec  # already run, under its slug: only its own spec goes back


if not any(isinstance(f, _OldNames) for f in sys.meta_path):
    sys.meta_path.append(_OldNames())


def __getattr__(name: str):
    """``from transformer_lib.experiments import ch14``: the module of the chapter's slug."""
    if name.partition("_")[0] in OLD_NAMES:
        return import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def experiment(chapter: str) -> Experiment:
    """The :class:`Experiment` of ``chapter`` (``"encoder_decoder"`` ... ``"attention_as_recurrence"``, ``"experts"``,
    ...), from its module (chapter "What attention learns")."""
    record_path(chapter)  # an unknown chapter: one sentence naming the known ones
    return import_module(f".{slug(chapter)}", __name__).EXPERIMENT


def main(argv: list[str] | None = None) -> int:
    """``python -m transformer_lib.experiments CHAPTER [--parts ...] [--seeds ...] [--steps N]
    [--dry-run] [--out FILE [--force]]`` (chapter "What attention learns"). A bad request is one line on stderr and exit
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
