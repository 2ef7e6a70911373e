"""``python -m transformer_lib.cli ...``: the same as ``python -m transformer_lib ...``."""

import sys

from . import main

sys.exit(main())
