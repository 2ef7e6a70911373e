"""Sphinx extension: self-check questions that give feedback on the published page, no kernel.

A chapter asks a question where a reader should stop and predict::

    ```{selfcheck} With B = 2, h = 4 and T = 5, what shape do the weights have?
    :kind: shape
    :answer-glue: q05_weights_shape
    :symbols: B=2, h=4, T=5
    :label: sc-05-1

    wrong: (B, T, T) :: That is the weight matrix of one head; each head has its own.
    wrong: glue:q05_scores_wrong :: ...

    The folded solution, in MyST markdown.
    ```

The right answer is read at build time from the notebook's own glued outputs
(``myst_nb.glue(key, value, display=False)`` in a code cell), so it cannot drift from what the
code computes; a missing key fails the build. The page stores only salted SHA-256 hashes of the
normalised right answer and of the known wrong answers (each with its hint), and the solution
encoded (so that neither the page source nor the search index shows it); ``selfcheck.js``
normalises what the reader types in the same way, hashes it and compares. Kinds:

- ``number``: exact (an integer such as a parameter count: ``4,096``, ``4096.0`` and ``4.096e3``
  are the same answer), or rounded half up to ``:sig:`` significant digits or ``:decimals:``
  decimal places (the question says how to round). ``:unit:`` is shown beside the box and may be
  typed after the number.
- ``shape``: a tuple such as ``(2, 4, 5, 5)``; spacing, brackets, a trailing comma and
  ``torch.Size`` are ignored, and the symbols of ``:symbols:`` (case, ``_`` and braces ignored,
  so ``T_q``, ``t_q`` and ``T_{q}`` are the same) stand for their sizes, so ``(B, h, T, T)``
  is also right.
- ``choice``: one of the ``option:`` lines; the glued value is the text of the right option.

Other builders (LaTeX for the PDF edition, text) print the question with its answer and the
solution right after it.

The extension is split by concern: :mod:`selfcheck_answers` (normalising and hashing answers),
:mod:`selfcheck_questions` (glued answers, the directive's body, labels, a notebook's questions),
:mod:`selfcheck_directive` (the directive and its nodes), :mod:`selfcheck_html` and
:mod:`selfcheck_latex` (rendering); this module connects them to Sphinx and re-exports the names
the tests use.
"""

from __future__ import annotations

from pathlib import Path

from selfcheck_answers import (  # noqa: F401 (re-exported)
    KINDS,
    SelfCheckError,
    decode_solution,
    digest,
    encode_solution,
    make_salt,
    normalise,
    normalise_choice,
    normalise_shape,
    parse_symbols,
    round_number,
)
from selfcheck_directive import SelfCheckDirective, selfcheck_node, selfcheck_solution
from selfcheck_html import _encode_solutions, depart_html, visit_html
from selfcheck_latex import _replace_for_other_builders, _skip
from selfcheck_questions import (  # noqa: F401 (re-exported)
    build_question,
    check_label,
    glued,
    questions_in_notebook,
    read_glue,
    split_body,
)

STATIC = Path(__file__).resolve().parent / "static"


def _add_static(app, config):
    config.html_static_path = [*config.html_static_path, str(STATIC)]


def _drop_glue_cache(app, env, docnames):
    env.temp_data.pop("selfcheck_glue", None)


def setup(app):
    app.connect("config-inited", _add_static)
    app.connect("env-before-read-docs", _drop_glue_cache)
    app.connect("doctree-resolved", _replace_for_other_builders)
    app.connect("doctree-resolved", _encode_solutions)
    app.add_css_file("selfcheck.css")
    app.add_js_file("selfcheck.js", loading_method="defer")
    app.add_node(
        selfcheck_node,
        html=(visit_html, depart_html),
        latex=(_skip, None),
        text=(_skip, None),
        man=(_skip, None),
        texinfo=(_skip, None),
    )
    app.add_node(
        selfcheck_solution,
        html=(_skip, None),
        latex=(_skip, None),
        text=(_skip, None),
        man=(_skip, None),
        texinfo=(_skip, None),
    )
    app.add_directive("selfcheck", SelfCheckDirective)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
