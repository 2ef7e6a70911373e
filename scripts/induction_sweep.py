"""Chapter "What attention learns"'s recorded experiment, under the name the chapter gives it: the same as
``python -m transformer_lib.experiments what_attention_learns``, which runs it (see
transformer_lib/experiments/what_attention_learns.py).

    python scripts/induction_sweep.py                  # everything, merged into transformer_lib/data/ch12/
    python scripts/induction_sweep.py --parts repeats --seeds 0 --dry-run
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from transformer_lib.experiments import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["what_attention_learns", *sys.argv[1:]]))
