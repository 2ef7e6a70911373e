"""``python -m transformer_lib``: the same command line as ``python -m transformer_lib.train``."""

import sys

from .train import main

sys.exit(main())
