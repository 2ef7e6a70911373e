#!/usr/bin/env bash
# Open every page of the built book (_build/html) in headless Chromium, with the network cut
# off, and check it: no failed requests, no console errors, images loaded, math rendered,
# widgets rendered, internal links resolve; every widget control, once moved, shows a new
# figure that matches its value; no code or output block scrolls sideways at a 1280-pixel
# window. Screenshots and a summary of the counts go to _build/screenshots.
# Then the student's path in a live JupyterLab (tests/browser/test_jupyterlab.py): chapter 4 run
# and its widgets moved, the student edition's exercise answered right and wrong through the page.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -f _build/html/index.html ]; then
  echo "error: build the book first (bash scripts/build_book.sh)" >&2
  exit 1
fi
.venv/bin/python -m pip install --quiet -r requirements-browser.txt
CHROMIUM=${CHROMIUM:-$(command -v chromium || command -v chromium-browser || true)}
if [ -z "$CHROMIUM" ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "Installing Chromium from the system's packages"
  apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
  CHROMIUM=$(command -v chromium)
fi
if [ -z "$CHROMIUM" ]; then
  echo "error: Chromium not found; install your system's chromium package or set CHROMIUM=/path/to/chrome" >&2
  exit 1
fi
export CHROMIUM REQUIRE_BROWSER_TEST=1
.venv/bin/python -m pytest -p no:cacheprovider -q tests/browser "$@"
