#!/usr/bin/env bash
# Install the book's web assets (MathJax, RequireJS and the Jupyter widget manager) from the npm
# registry into .cache/web-assets, so the built site serves them itself and renders its math and
# widgets with no network. Without npm the book still builds and loads them from their CDNs.
set -euo pipefail
cd "$(dirname "$0")/.."
dest=.cache/web-assets
if [ -f "$dest/static/mathjax/tex-chtml.js" ] && [ -f "$dest/static/html-manager/embed-amd.js" ]; then
  exit 0
fi
if ! command -v npm >/dev/null 2>&1; then
  echo "note: npm not found; the book's math and widgets will load from public CDNs (online only)." >&2
  exit 0
fi
mkdir -p "$dest"
npm install --prefix "$dest" --no-audit --no-fund --no-save --loglevel=error \
  mathjax@3.2.2 @jupyter-widgets/html-manager@1.0.15 requirejs@2.3.7
rm -rf "$dest/static" && mkdir -p "$dest/static"
cp -r "$dest/node_modules/mathjax/es5" "$dest/static/mathjax"
cp -r "$dest/node_modules/@jupyter-widgets/html-manager/dist" "$dest/static/html-manager"
cp "$dest/node_modules/requirejs/require.js" "$dest/static/require.js"
echo "Web assets ready in $dest/static (served by the site, no CDN needed)"
