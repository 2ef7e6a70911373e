"""The ``selfcheck`` directive (:mod:`selfcheck`) and the two nodes it makes: the question's box,
and its solution, which each builder renders in its own way (:mod:`selfcheck_html`,
:mod:`selfcheck_latex`).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from docutils import nodes
from docutils.parsers.rst import directives
from selfcheck_answers import KINDS
from selfcheck_questions import build_question, check_label, read_glue, split_body
from sphinx.util.docutils import SphinxDirective


class selfcheck_node(nodes.General, nodes.Element):
    pass


class selfcheck_solution(nodes.General, nodes.Element):
    pass


def _nonnegative(text):
    return directives.nonnegative_int(text)


class SelfCheckDirective(SphinxDirective):
    required_arguments = 1
    final_argument_whitespace = True
    has_content = True
    option_spec = {
        "kind": lambda t: directives.choice(t, KINDS),
        "answer-glue": directives.unchanged_required,
        "sig": directives.positive_int,
        "decimals": _nonnegative,
        "unit": directives.unchanged,
        "symbols": directives.unchanged,
        "label": directives.unchanged_required,
    }

    def run(self):
        env = self.env
        docname = env.docname
        counter = env.temp_data.setdefault("selfcheck_counter", {})
        counter[docname] = counter.get(docname, 0) + 1
        qid = self.options.get("label") or f"sc-{re.sub(r'[^a-z0-9]+', '-', docname.lower())}-{counter[docname]}"
        check_label(qid, env.temp_data.setdefault("selfcheck_labels", set()), str(env.doc2path(docname)))
        entries, solution_lines, start = split_body(list(self.content))
        spec = {
            "kind": self.options.get("kind", "number"),
            "answer_glue": self.options.get("answer-glue"),
            "sig": self.options.get("sig"),
            "decimals": self.options.get("decimals"),
            "unit": self.options.get("unit"),
            "symbols": self.options.get("symbols"),
            "entries": entries,
        }
        # a missing or bad answer raises SelfCheckError, which stops the build with its message
        built = build_question(spec, _glue_values(env, docname), docname, qid)
        node = selfcheck_node()
        node["ids"].append(qid)
        node["data"] = built["data"]
        node["answer_text"] = built["answer_text"]
        node["docname"] = docname
        question = nodes.paragraph()
        question["classes"].append("selfcheck-question")
        inline, messages = self.state.inline_text(self.arguments[0], self.lineno)
        question += inline
        node += question
        node += messages
        if any(line.strip() for line in solution_lines):
            solution = selfcheck_solution()
            self.state.nested_parse(self.content[start:], self.content_offset + start, solution)
            node += solution
        self.set_source_info(node)
        return [node]


def _glue_values(env, docname):
    cache = env.temp_data.setdefault("selfcheck_glue", {})
    if docname not in cache:
        path = Path(env.doc2path(docname))
        if path.suffix != ".ipynb":
            cache[docname] = {}
        else:
            cache[docname] = read_glue(json.loads(path.read_text(encoding="utf-8")))
    return cache[docname]
