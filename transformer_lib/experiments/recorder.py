"""The recorder of the chapters' experiments: run parts and seeds, merge them into the record,
write it atomically, stamped with the versions that made it.

An experiment is a chapter's set of named parts; a part is a function ``run(seeds, steps)`` that
trains and measures each seed and returns the record's entries it fills, for example
``{"settings": {...}, "lr": {"runs": [...]}}``. The recorder keeps one policy for all of them:

- a smoke run (``steps`` set: fewer training steps) changes the recorded result, so it must be a
  dry run, and a dry run never writes; both are checked before any training;
- new runs are merged into the existing record by their key (the part, then the fields of
  ``KEY_FIELDS`` a run has: its seed, and the method, tokenizer, depth ... it was run with), so a
  part or a seed can be re-run alone;
- the record is written atomically (:func:`transformer_lib.utils.atomic_write`), with
  ``versions``: Python's, PyTorch's and the library's, and the thread count.
"""

from __future__ import annotations

import json
import platform
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .._checks import is_int
from ..chapters import data_folder, slug
from ..utils import atomic_write

__all__ = [
    "RECORDS",
    "Experiment",
    "Part",
    "check_out",
    "is_record",
    "merge",
    "record_path",
    "recorded",
    "run_experiment",
    "write_record",
]

DATA = Path(__file__).resolve().parent.parent / "data"
#: each chapter's record, by the chapter's slug, in its data folder
#: (:func:`transformer_lib.chapters.data_folder`); in the book's order
RECORDS = {
    "encoder_decoder": "encoder_decoder.json",
    "gpt": "gpt_runs.json",
    "generation": "generation.json",
    "what_attention_learns": "induction_sweep.json",
    "tokens": "token_sweep.json",
    "todays_block": "block_sweep.json",
    "fine_tuning": "finetune_sweep.json",
    "measuring_a_model": "report_cards.json",
    "preferences_and_rewards": "preferences.json",
    "latent_sparse_sink": "attention_today.json",
    "attention_as_recurrence": "recurrence.json",
    "experts": "experts_sweep.json",
    "longer_than_trained": "longer_sweep.json",
}
#: the fields that name a run in a list of runs, outermost loop first (a list of dicts is merged
#: by the fields of this tuple that its items have, a missing one read as None; an item with a
#: ``seed`` is a run, replaced whole; one without, such as a row of runs, is merged)
KEY_FIELDS = ("name", "method", "variant", "qk_norm", "seed", "tokenizer", "n_layers")
#: one thread: the thread count changes the rounding of sums
THREADS = 1


@dataclass(frozen=True)
class Part:
    """One named part of an experiment: ``run(seeds, steps)`` returns the record's entries it
    fills; ``seeds`` are the seeds it records (chapter "What attention learns")."""

    run: Callable[[list[int], int | None], dict]
    seeds: list[int]


@dataclass(frozen=True)
class Experiment:
    """A chapter's recorded experiment: its parts, by name, in the order they run (chapter "What attention learns")."""

    chapter: str
    parts: dict[str, Part] = field(default_factory=dict)

    @property
    def path(self) -> Path:
        return record_path(self.chapter)


def record_path(chapter: str) -> Path:
    """The JSON file that holds ``chapter``'s recorded experiment (chapter "What attention learns"):
    ``chapter`` is the chapter's slug, ``"todays_block"``, or its old name, ``"ch14"``."""
    try:
        name = slug(chapter)
    except ValueError:
        name = None
    if name not in RECORDS:
        raise ValueError(f"no recorded experiment for {chapter!r}; the chapters with one are {', '.join(RECORDS)}")
    return data_folder(name) / RECORDS[name]


def recorded(chapter: str) -> dict:
    """The recorded results of ``chapter``'s experiment, by the chapter's slug (``"todays_block"``)
    or its old name (``"ch14"``), as the chapter's notebook reads them: the parsed JSON shipped with
    the library (chapter "What attention learns")."""
    return json.loads(record_path(chapter).read_text(encoding="utf-8"))


def merge(old, new):
    """``new`` merged into ``old`` (chapter "What attention learns"): dicts key by key, lists of runs by their key
    (``KEY_FIELDS``), in the order of the loops that made them; anything else is replaced."""
    if isinstance(old, dict) and isinstance(new, dict):
        out = dict(old)
        for key, value in new.items():
            out[key] = merge(old[key], value) if key in old else value
        return out
    fields = _key_fields(old, new)
    if not fields:
        return new
    merged: dict[tuple, dict] = {}
    for item in old:
        merged[tuple(item.get(f) for f in fields)] = item
    for item in new:
        key = tuple(item.get(f) for f in fields)
        whole = "seed" in fields or key not in merged
        merged[key] = item if whole else merge(merged[key], item)
    # each field's values ranked by their first appearance: the old order, new values after it
    rank = {f: {} for f in fields}
    for item in [*old, *new]:
        for f in fields:
            rank[f].setdefault(item.get(f), len(rank[f]))
    return sorted(merged.values(), key=lambda item: tuple(rank[f][item.get(f)] for f in fields))


def _key_fields(old, new) -> tuple[str, ...]:
    if not (isinstance(old, list) and isinstance(new, list)):
        return ()
    items = [*old, *new]
    if not items or not all(isinstance(item, dict) for item in items):
        return ()
    return tuple(f for f in KEY_FIELDS if any(f in item for item in items))


def versions() -> dict:
    """The stamp a new write carries: the versions and the thread count that made the record."""
    from .. import __version__

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformer_lib": __version__,
        "threads": THREADS,
    }


def write_record(path: str | Path, record: dict) -> Path:
    """Write ``record`` to ``path`` as the records are written (JSON, indent 1, a final newline),
    atomically: a failure half-way leaves the previous file as it was (chapter "What attention learns")."""

    def write(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(record, f, indent=1)
            f.write("\n")

    return atomic_write(path, write)


def check_request(experiment: Experiment, parts=None, seeds=None, steps=None, dry_run=False) -> list[str]:
    """The parts to run, once the request is known to be valid: raises ``ValueError`` (one
    sentence) for an unknown part, a negative seed, a step count below 1, or a smoke run that
    would be written."""
    parts = list(experiment.parts) if parts is None else list(parts)
    unknown = [p for p in parts if p not in experiment.parts]
    if unknown or not parts:
        raise ValueError(
            f"{experiment.chapter} has no part {', '.join(map(repr, unknown)) or '(none given)'}; "
            f"its parts are {', '.join(experiment.parts)}"
        )
    if seeds is not None and (not seeds or any(not is_int(s) or s < 0 for s in seeds)):
        raise ValueError(f"seeds must be whole numbers from 0, got {seeds}")
    if steps is not None and steps < 1:
        raise ValueError(f"--steps must be at least 1, got {steps}")
    if steps is not None and not dry_run:
        raise ValueError("--steps changes the recorded result: a smoke run needs --dry-run, which writes nothing")
    return parts


def _stamped(old: dict) -> bool:
    """Does ``old`` carry the stamp this recorder writes: ``versions`` with exactly the fields of
    :func:`versions`, or the older stamp (``torch``, a string, and ``threads``, an int)?"""
    stamp = old.get("versions")
    if isinstance(stamp, dict):
        return set(stamp) == set(versions()) and isinstance(stamp["threads"], int)
    return isinstance(old.get("torch"), str) and type(old.get("threads")) is int


def _record_keys(experiment: Experiment) -> set[str]:
    """The entries a record of ``experiment`` may hold besides its stamp: its parts' names,
    ``settings`` and the entries of its shipped record."""
    keys = {*experiment.parts, "settings"}
    try:
        shipped = json.loads(experiment.path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        shipped = {}
    return keys | (set(shipped) - {"versions", "torch", "threads"} if isinstance(shipped, dict) else set())


def is_record(experiment: Experiment, old) -> bool:
    """Is ``old`` (a parsed JSON file) a record of ``experiment`` that this recorder wrote: a dict
    with the recorder's stamp (:func:`_stamped`) and at least one other entry, each one that a
    record of ``experiment`` holds? A file of the user's with a ``settings`` entry is not one."""
    if not isinstance(old, dict) or not _stamped(old):
        return False
    entries = set(old) - {"versions", "torch", "threads"}
    return bool(entries) and entries <= _record_keys(experiment)


def check_out(experiment: Experiment, out: str | Path | None, force: bool = False) -> bool:
    """Before any training: a file already at ``out`` (None: the shipped record) must be a record of
    ``experiment`` (:func:`is_record`), which is merged into and rewritten, never another file of
    the user's, unless ``force``, which replaces it (chapter "What attention learns"). Returns whether there is a
    record to merge into; raises ``ValueError`` naming the file otherwise."""
    out = experiment.path if out is None else Path(out)
    if not out.exists():
        return False
    try:
        old = json.loads(out.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        old = None
    if is_record(experiment, old):
        return True
    if force:
        return False
    raise ValueError(
        f"{out} holds something other than a record of {experiment.chapter}: choose another --out "
        "(or --force to replace it)"
    )


def run_experiment(
    experiment: Experiment, parts=None, seeds=None, steps=None, dry_run=False, out=None, force: bool = False
) -> dict:
    """Run ``parts`` (default: all) of ``experiment`` for ``seeds`` (default: each part's own),
    merge them into the record at ``out`` (default: the shipped one) and write it, unless
    ``dry_run``; returns the merged record (chapter "What attention learns"). A file at ``out`` that is not a record of
    ``experiment`` is refused before any training (:func:`check_out`), or replaced with ``force``.

    Everything is checked before any training (:func:`check_request`); ``steps`` (a smoke run)
    needs ``dry_run``. The runs use one thread, as the records were made."""
    parts = check_request(experiment, parts, seeds, steps, dry_run)
    out = Path(out) if out is not None else experiment.path
    merge_into = check_out(experiment, out, force)
    threads = torch.get_num_threads()
    torch.set_num_threads(THREADS)
    try:
        fresh: dict = {}
        for name in parts:
            part = experiment.parts[name]
            fresh = merge(fresh, part.run(list(seeds) if seeds is not None else part.seeds, steps))
    finally:
        torch.set_num_threads(threads)
    # read the record only now: other parts may have been written meanwhile by another process
    old = json.loads(out.read_text(encoding="utf-8")) if merge_into and out.exists() else {}
    for legacy in ("torch", "threads"):  # the stamp before "versions"
        old.pop(legacy, None)
    record = merge({"versions": versions(), **old}, {"versions": versions(), **fresh})
    if not dry_run:
        write_record(out, record)
        print(f"wrote {out}")
    return record
