"""The command line ``python -m transformer_lib.student OUT [--nbgrader]``."""

from __future__ import annotations

import argparse
import sys

from .edition import make_student_edition
from .nbgrader import make_course
from .notebooks import EditionError

__all__ = ["main"]


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line on stderr, status 2 (argparse prints the usage too)
        self.exit(2, f"error: {message} ({self.prog} --help lists the flags)\n")


def main(argv: list[str] | None = None) -> int:
    """Instructors' guide: the command line ``python -m transformer_lib.student``; returns the exit status."""
    parser = _Parser(
        prog="python -m transformer_lib.student",
        description="Write the student edition of the chapter notebooks (solutions replaced by stubs), "
        "or with --nbgrader an nbgrader course folder.",
    )
    parser.add_argument("out_dir", help="folder to write into")
    parser.add_argument("--chapters", default="chapters", help="folder of the book's notebooks (default: chapters)")
    parser.add_argument(
        "--chapter", action="append", metavar="NAME", help="only this chapter, by its name, e.g. masking"
    )
    parser.add_argument("--nbgrader", action="store_true", help="write an nbgrader course folder")
    parser.add_argument("--force", action="store_true", help="overwrite files that exist")
    parser.add_argument("--debug", action="store_true", help="show the traceback of an error")
    args = parser.parse_args(argv)
    try:
        if args.nbgrader:
            make_course(args.out_dir, args.chapters, force=args.force, only=args.chapter)
        else:
            make_student_edition(args.out_dir, args.chapters, force=args.force, only=args.chapter)
    except (EditionError, OSError) as exc:
        if args.debug:
            raise
        message = str(exc) if isinstance(exc, EditionError) else f"cannot write: {exc}"
        print(f"error: {message}", file=sys.stderr)
        return 2
    return 0
