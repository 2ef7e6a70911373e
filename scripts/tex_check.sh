# Sourced by scripts/build_pdf.sh: what the PDF edition needs from the system, and
# missing_tex, which prints one line for each thing this system lacks (nothing when all is
# there): a program, a LaTeX package, a font. XeLaTeX alone is not enough.
TEX_PACKAGES=(texlive-xetex texlive-latex-extra texlive-fonts-recommended texlive-fonts-extra
  latexmk fonts-freefont-otf poppler-utils)
# LaTeX packages the build loads (Sphinx's LaTeX with XeLaTeX, and bbm for the book's blackboard 1)
TEX_STYLES=(fontspec polyglossia fncychap titlesec tabulary varwidth fancyvrb wrapfig upquote
  capt-of needspace geometry hyperref amsmath bbm)
missing_tex() {
  command -v xelatex >/dev/null || echo "the program xelatex (Debian/Ubuntu: texlive-xetex)"
  command -v latexmk >/dev/null || echo "the program latexmk (Debian/Ubuntu: latexmk)"
  if command -v kpsewhich >/dev/null; then
    local style
    for style in "${TEX_STYLES[@]}"; do
      kpsewhich "$style.sty" >/dev/null || echo "the LaTeX package $style ($style.sty, not found by kpsewhich)"
    done
  elif command -v xelatex >/dev/null; then
    echo "the program kpsewhich (part of every TeX installation), to find the LaTeX packages"
  fi
  # grep reads all of fc-list (no -q): with pipefail, an early exit would fail the pipe (SIGPIPE)
  if ! { command -v fc-list >/dev/null && fc-list 2>/dev/null | grep FreeSerif >/dev/null; }; then
    echo "the font FreeSerif (Debian/Ubuntu: fonts-freefont-otf)"
  fi
  command -v pdftotext >/dev/null || echo "the program pdftotext, which tests/pdf reads the PDF with (Debian/Ubuntu: poppler-utils)"
  return 0
}
