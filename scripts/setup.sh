#!/usr/bin/env bash
# Create .venv (if missing) and install everything the book, the notebooks and the tests need.
# Set TORCH_INDEX_URL (for example https://download.pytorch.org/whl/cpu) to take PyTorch from a
# specific index first, such as the small CPU-only build on Linux.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "Creating .venv with $($PYTHON --version)"
  "$PYTHON" -m venv .venv
fi
if [ -n "${TORCH_INDEX_URL:-}" ]; then
  # the PyTorch range is written once, in pyproject.toml
  torch_req=$(grep -o '"torch[^"]*"' pyproject.toml | tr -d '"')
  .venv/bin/python -m pip install --quiet "$torch_req" --index-url "$TORCH_INDEX_URL"
fi
.venv/bin/python -m pip install --quiet -r requirements.txt
echo "Environment ready in .venv: $(.venv/bin/python -c 'import torch; print("torch", torch.__version__)')"
