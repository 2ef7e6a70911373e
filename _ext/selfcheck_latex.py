"""Self-check outside HTML (:mod:`selfcheck`): LaTeX for the PDF edition, text and the rest print
each question with its answer and its solution in clear, in a "Check yourself" box.
"""

from __future__ import annotations

from docutils import nodes
from selfcheck_directive import selfcheck_node, selfcheck_solution


def _skip(self, node):
    raise nodes.SkipNode


def _replace_for_other_builders(app, doctree, docname):
    """Outside HTML, print the question, its answer and its solution in clear."""
    if app.builder.format == "html":
        return
    for node in list(doctree.findall(selfcheck_node)):
        box = nodes.admonition()
        box["classes"].append("selfcheck")
        box += nodes.title(text="Check yourself")
        body = nodes.container()
        answer = nodes.paragraph()
        answer += nodes.strong(text="Answer:")
        answer += nodes.Text(" ")
        answer += nodes.literal(text=node["answer_text"])
        solutions = [c for c in node.children if isinstance(c, selfcheck_solution)]
        body += [c for c in node.children if not isinstance(c, selfcheck_solution)]
        body += answer
        for solution in solutions:
            body += solution.children
        box += body
        node.replace_self(box)
