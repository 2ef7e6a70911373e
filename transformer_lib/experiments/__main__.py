"""``python -m transformer_lib.experiments todays_block --parts lr --seeds 0 --dry-run``: see :func:`main`."""

import sys

from . import main

sys.exit(main())
