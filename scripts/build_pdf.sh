#!/usr/bin/env bash
# Build the whole book as one PDF with XeLaTeX: _build/latex/attention-executed.pdf.
# Uses the saved notebooks (nothing is re-executed). Needs Debian's TeX packages; as root on a
# Debian or Ubuntu system the script installs the missing ones (about 1 GB, a few minutes),
# waiting for another package install to finish if one holds the lock.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh

source scripts/tex_check.sh
missing=$(missing_tex)
if [ -n "$missing" ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "Installing XeLaTeX and fonts from the system's packages: ${TEX_PACKAGES[*]}"
    for attempt in 1 2 3 4 5; do
      if apt-get -o DPkg::Lock::Timeout=300 update -qq >/dev/null &&
        DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -qq \
          --no-install-recommends "${TEX_PACKAGES[@]}" >/dev/null; then
        break
      fi
      [ "$attempt" = 5 ] && { echo "error: could not install ${TEX_PACKAGES[*]}" >&2; exit 1; }
      echo "apt-get failed (attempt $attempt of 5); retrying in 30 s" >&2
      sleep 30
    done
    missing=$(missing_tex)
  fi
  if [ -n "$missing" ]; then
    echo "error: the PDF edition needs what this system lacks:" >&2
    while IFS= read -r line; do echo "  - $line" >&2; done <<<"$missing"
    echo "Install them (Debian/Ubuntu: ${TEX_PACKAGES[*]}), then run this again." >&2
    exit 1
  fi
fi

# Its own build folder: the HTML build's cached pages (widgets as live views) must not be reused
# here, where every widget is replaced by its default frame, nor the other way round.
.venv/bin/jupyter-book build . --builder pdflatex --path-output _build/pdf "$@"
built=_build/pdf/_build/latex
if [ ! -s "$built/attention-executed.pdf" ]; then
  echo "error: the LaTeX build wrote no PDF; see $built/attention-executed.log" >&2
  exit 1
fi
mkdir -p _build/latex
cp "$built/attention-executed.pdf" "$built/attention-executed.log" _build/latex/
pdf=_build/latex/attention-executed.pdf
echo
echo "The PDF is built: $(pwd)/$pdf"
