"""Chapter "Fine-tuning"'s recorded experiment, under the name the chapter gives it: the same as
``python -m transformer_lib.experiments fine_tuning``, which runs it (see transformer_lib/experiments/fine_tuning.py).

    python scripts/finetune_sweep.py                  # everything, merged into transformer_lib/data/ch15/
    python scripts/finetune_sweep.py --parts instructions --seeds 0 --dry-run
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from transformer_lib.experiments import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["fine_tuning", *sys.argv[1:]]))
