#!/usr/bin/env bash
# The lower bounds, tested: a throwaway environment (.venv-lower) with every range's lowest release
# (scripts/lower_bounds.txt), in which the chapters that use a bounded package beyond PyTorch and
# NumPy run top to bottom and the tests that compare with transformers, peft, tiktoken, rustbpe and
# scikit-learn pass. The outputs are not compared with the saved ones: other releases may print
# other digits; what is checked is that every cell runs and every assertion holds.
#
#     bash scripts/test_lower_bounds.sh                 # every chapter listed below, then the tests
#     bash scripts/test_lower_bounds.sh chapters/13_tokens.ipynb   # only these notebooks, then the tests
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=$(realpath -m "${LOWER_VENV:-.venv-lower}")
PINS=scripts/lower_bounds.txt
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
if [ -n "${TORCH_INDEX_URL:-}" ]; then
  # PyTorch's pin from an index of CPU builds (https://download.pytorch.org/whl/cpu, as scripts/setup.sh)
  "$VENV/bin/python" -m pip install --quiet "$(grep '^torch==' "$PINS")" --index-url "$TORCH_INDEX_URL"
fi
packages=$(grep -oE '^[A-Za-z0-9_.-]+==' "$PINS" | tr -d '=')
# shellcheck disable=SC2086
"$VENV/bin/python" -m pip install --quiet --constraint "$PINS" $packages nbclient
"$VENV/bin/python" -m pip install --quiet --no-deps -e .
# every pin installed as written (a package that pip resolved otherwise would test nothing)
"$VENV/bin/python" - "$PINS" <<'PY'
import sys
from importlib.metadata import version

wrong = []
for line in open(sys.argv[1], encoding="utf-8"):
    if "==" in line and not line.startswith("#"):
        name, pinned = line.strip().split("==")
        if version(name).split("+")[0] != pinned:
            wrong.append(f"{name} {version(name)} (pinned {pinned})")
print("lower bounds installed:" if not wrong else "not the pinned release:", ", ".join(wrong) or "all")
sys.exit(1 if wrong else 0)
PY
export PATH="$VENV/bin:$PATH"
notebooks=("$@")
if [ ${#notebooks[@]} -eq 0 ]; then
  # ipywidgets and matplotlib (every chapter) run in each of these too
  notebooks=(chapters/10_generation.ipynb chapters/13_tokens.ipynb chapters/14_todays_block.ipynb
    chapters/15_fine_tuning.ipynb chapters/18_latent_sparse_sink.ipynb
    chapters/19_attention_as_recurrence.ipynb chapters/20_experts.ipynb
    chapters/21_longer_than_trained.ipynb)
fi
for nb in "${notebooks[@]}"; do
  echo "lower bounds: $nb"
  # run, not saved: the notebook in the repository keeps its outputs
  if ! jupyter execute --timeout=1200 "$nb" >"$VENV/last_notebook.log" 2>&1; then
    tail -n 40 "$VENV/last_notebook.log"
    exit 1
  fi
done
# the fast tests that import transformers, peft, tiktoken, rustbpe or tokenizers
"$VENV/bin/python" -m pytest -p no:cacheprovider -q -x -rs -m "not slow" tests/test_pretrained.py \
  tests/test_pretrained_llama.py tests/test_lora.py tests/test_bpe.py tests/test_export.py \
  tests/test_export_experts.py tests/test_experts_parity.py tests/test_latent_attention.py \
  tests/test_linear_attention.py tests/test_sparse_attention.py tests/test_sinks.py \
  tests/test_rope_scaling.py tests/test_rope_scaling_parity.py tests/test_token_rows.py \
  tests/test_exercises_experts.py tests/test_exercises_longer_than_trained.py tests/test_broken_weights.py \
  tests/test_bad_input_part4.py tests/test_cli_finetune.py tests/test_lower_bounds.py
