#!/usr/bin/env bash
# Set up .venv, then build the book's HTML from the saved notebooks, with warnings as errors.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/web_assets.sh
.venv/bin/jupyter-book build . -W --keep-going "$@"
echo
echo "The book is built: open $(pwd)/_build/html/index.html"
