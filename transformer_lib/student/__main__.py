"""``python -m transformer_lib.student``: see :mod:`transformer_lib.student.cli`."""

from .cli import main

raise SystemExit(main())
