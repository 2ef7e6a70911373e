"""Chapter "Tokens"'s recorded experiment, under the name the chapter gives it: the same as
``python -m transformer_lib.experiments tokens``, which runs it (see transformer_lib/experiments/tokens.py).

    python scripts/token_sweep.py                  # everything, merged into transformer_lib/data/ch13/
    python scripts/token_sweep.py --seeds 0 --dry-run
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from transformer_lib.experiments import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["tokens", *sys.argv[1:]]))
