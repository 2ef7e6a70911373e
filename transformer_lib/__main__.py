"""``python -m transformer_lib train|sample ...``: the command line of :mod:`transformer_lib.cli`."""

import sys

from .cli import main

sys.exit(main())
