"""The book's chapters, in reading order, each known by a name that does not move.

A chapter's notebook is ``chapters/NN_<slug>.ipynb``: the number ``NN`` is its place in the table
of contents and changes whenever a chapter is inserted before it, so the library never uses it.
It names a chapter by its *slug* (``"todays_block"``), which names its modules
(``transformer_lib.exercises.todays_block``, ``transformer_lib.experiments.todays_block``) and its
recorded experiment (``recorded("todays_block")``), and in prose by its *title*, the notebook's
first heading (chapter "Today's block"). Inserting a chapter then changes the table of contents,
the notebooks' file names, the README and the redirects, and adds one line here; nothing else in
the library moves. ``tests/test_layout.py`` checks that this list, the table of contents and
every list a chapter joins (modules, records, API pages) agree.

The library once named chapters by number. Those names still work as aliases: ``OLD_NAMES`` maps
each one (``"ch14"``) to its slug. They are a fixed record of what the names used to be, not
numbers to keep up to date, and a data folder keeps its old name (``data/ch14``) for the same
reason: :func:`data_folder` says which.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

__all__ = ["CHAPTERS", "OLD_NAMES", "Chapter", "chapter", "data_folder", "slug", "title"]


class Chapter(NamedTuple):
    """One chapter: its slug (its notebook's file name without the number) and its title (the
    notebook's first heading, as plain text)."""

    slug: str
    title: str


#: every chapter, in the book's order
CHAPTERS: tuple[Chapter, ...] = (
    Chapter("why_attention", "Why attention?"),
    Chapter("queries_keys_values", "Queries, keys and values"),
    Chapter("scaling", "Why divide by sqrt(d_k)"),
    Chapter("masking", "Masking"),
    Chapter("multihead", "Multi-head attention"),
    Chapter("positional_encoding", "Positional encoding"),
    Chapter("transformer_block", "The transformer block"),
    Chapter("encoder_decoder", "Encoder-decoder and cross-attention"),
    Chapter("gpt", "A GPT from scratch"),
    Chapter("generation", "Generation"),
    Chapter("long_context_and_precision", "Long context and precision"),
    Chapter("what_attention_learns", "What attention learns"),
    Chapter("tokens", "Tokens"),
    Chapter("todays_block", "Today's block"),
    Chapter("fine_tuning", "Fine-tuning"),
    Chapter("measuring_a_model", "Measuring a model"),
    Chapter("preferences_and_rewards", "Preferences and rewards"),
    Chapter("latent_sparse_sink", "Latent, sparse and sink attention"),
    Chapter("attention_as_recurrence", "Attention as a recurrence"),
    Chapter("experts", "Experts"),
    Chapter("longer_than_trained", "Longer than trained"),
)

#: the names the library gave chapters when it named them by number, each with its slug: modules
#: (``exercises.ch04``), records (``recorded("ch14")``) and data folders (``data/ch14``) by these
#: names still work. Fixed: a chapter added later has no old name.
OLD_NAMES: dict[str, str] = {
    "ch01": "why_attention",
    "ch02": "queries_keys_values",
    "ch03": "scaling",
    "ch04": "masking",
    "ch05": "multihead",
    "ch06": "positional_encoding",
    "ch07": "transformer_block",
    "ch08": "encoder_decoder",
    "ch09": "gpt",
    "ch10": "generation",
    "ch11": "long_context_and_precision",
    "ch12": "what_attention_learns",
    "ch13": "tokens",
    "ch14": "todays_block",
    "ch15": "fine_tuning",
    "ch16": "measuring_a_model",
    "ch17": "preferences_and_rewards",
    "ch18": "latent_sparse_sink",
    "ch19": "attention_as_recurrence",
}

_BY_SLUG = {c.slug: c for c in CHAPTERS}
_DATA = Path(__file__).resolve().parent / "data"


def slug(name: str) -> str:
    """The slug of the chapter called ``name``: a slug (returned as it is) or an old name
    (``"ch14"`` -> ``"todays_block"``). Raises ``ValueError`` for any other name."""
    found = OLD_NAMES.get(name, name)
    if found not in _BY_SLUG:
        raise ValueError(f"no chapter is called {name!r}; the chapters are {', '.join(_BY_SLUG)}")
    return found


def chapter(name: str) -> Chapter:
    """The :class:`Chapter` called ``name`` (a slug or an old name)."""
    return _BY_SLUG[slug(name)]


def title(name: str) -> str:
    """The title of the chapter called ``name`` (a slug or an old name): ``"todays_block"`` ->
    ``"Today's block"``."""
    return chapter(name).title


def data_folder(name: str) -> Path:
    """The folder of ``transformer_lib/data`` that holds the files of the chapter called ``name``:
    ``data/<slug>``, or the folder under its old name where that is the one that exists
    (``data/ch14`` for ``"todays_block"``)."""
    found = slug(name)
    old = [k for k, v in OLD_NAMES.items() if v == found]
    for candidate in [found, *old]:
        if (_DATA / candidate).is_dir():
            return _DATA / candidate
    return _DATA / found
