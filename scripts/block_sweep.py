"""Chapter "Today's block"'s recorded experiment, under the name the chapter gives it: the same as
``python -m transformer_lib.experiments todays_block``, which runs it (see transformer_lib/experiments/todays_block.py).

    python scripts/block_sweep.py                  # everything, merged into transformer_lib/data/ch14/
    python scripts/block_sweep.py --parts lr --seeds 0 --dry-run
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from transformer_lib.experiments import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["todays_block", *sys.argv[1:]]))
