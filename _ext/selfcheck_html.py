"""Self-check in HTML (:mod:`selfcheck`): the box holds the question, the hashes and the hints
as data, and the solution only encoded; the reader's side is ``static/selfcheck.js``.
"""

from __future__ import annotations

import json

from docutils import nodes
from selfcheck_answers import encode_solution
from selfcheck_directive import selfcheck_solution


def visit_html(self, node):
    qid, data = self.attval(node["ids"][0]), self.attval(json.dumps(node["data"]))
    self.body.append(
        f'<div class="selfcheck" id="{qid}" data-selfcheck="{data}"><p class="selfcheck-title">Check yourself</p>'
    )


def depart_html(self, node):
    self.body.append("</div>\n")


def _encode_solutions(app, doctree, docname):
    """In HTML, render each solution now and keep it only encoded, in an attribute: neither the
    page's text nor the search index holds it."""
    if app.builder.format != "html":
        return
    for node in list(doctree.findall(selfcheck_solution)):
        box = nodes.container()
        box += [child.deepcopy() for child in node.children]
        html = app.builder.render_partial(box)["fragment"]
        salt = node.parent["data"]["salt"]
        encoded = encode_solution(salt, html)
        node.replace_self(
            nodes.raw("", f'<div class="selfcheck-solution" hidden data-encoded="{encoded}"></div>', format="html")
        )
