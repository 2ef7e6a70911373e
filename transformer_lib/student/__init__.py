"""Write the student edition of the book's notebooks (solutions out, checks kept), or a graded
nbgrader course.

    python -m transformer_lib.student OUT_DIR [--nbgrader] [--chapter NAME ...] [--force]

For every notebook under ``chapters/`` the student edition writes a copy into ``OUT_DIR`` where

- each code cell tagged ``solution`` keeps its imports and the signature and docstring of each
  function, with the body replaced by ``raise NotImplementedError`` (the checks report "not
  implemented yet" for those);
- each markdown cell tagged ``solution`` (the written solutions) is removed, as is any
  ``{solution}`` directive left in other markdown cells;
- all outputs and execution counts are cleared.

With ``--nbgrader`` it writes an nbgrader course folder instead (see :mod:`transformer_lib.student.nbgrader`).

Nothing a user has is lost: every notebook is read and checked before any file is written; the
command refuses to write into the book's ``chapters/`` (or any folder holding the book's source
notebooks) and refuses to overwrite an existing file unless ``--force``; each file is written
atomically. Errors print one line on stderr and exit with status 2 (``--debug`` shows the
traceback). The instructor's guide in the book explains how to hand the edition out.

Modules: :mod:`.notebooks` (reading, checking and writing notebooks, written once),
:mod:`.edition` (the student edition), :mod:`.nbgrader` (the course) and :mod:`.cli`.
"""

from . import edition, notebooks
from .edition import *  # noqa: F403 (the public names of the edition and of the notebooks are the package's)
from .notebooks import *  # noqa: F403

__all__ = [*notebooks.__all__, *edition.__all__]
