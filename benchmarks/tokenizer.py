"""Byte-level BPE: the book's trainer against the naive reference and the Rust trainers, and its
encoder against tiktoken (chapter "Tokens").

``naive_train_bpe`` is the reference: it recounts every pair of every chunk at every merge, which
is what the book's incremental trainer must agree with, merge for merge.

``python -m benchmarks.tokenizer`` times, on Tiny Shakespeare (or ``--data FILE``) and for each
of ``--merges`` (1,000 and 4,000), with one pre-split pattern (``--pattern``, GPT-2's):

- training: ``tl.train_bpe`` (ours), ``naive_train_bpe`` (``--no-naive`` skips it; it runs
  ``--naive-repeat`` times, once by default, since at 4,000 merges it takes minutes), Hugging
  Face ``tokenizers``' ``BpeTrainer`` (a ``ByteLevel`` pre-tokenizer with
  ``add_prefix_space=False`` and the 256 byte stand-ins as its initial alphabet) and ``rustbpe``.
  Ours and the naive one run pinned to one core (``os.sched_setaffinity``, every thread of the
  process); the two Rust trainers use threads, so they are timed pinned to the same core and
  again on every core the process may use. Each timing is repeated ``--repeat`` times, the
  trainers taking turns in an order that rotates every round; the table gives the median wall
  time with its spread, and the CPU time of the process (which on a machine shared with other
  work counts only the time the trainer ran, not the time it waited for a core);
- the checks: the naive reference learns the same merges as ours, ``rustbpe``'s ranks equal
  ours (both raise ``AssertionError`` if not), and how Hugging Face's merges compare: how many
  are the same at the same index, how many as a set, and the first index where the order
  differs, with the two pairs and their counts at that point. ``tokenizers`` breaks a tie
  between equally frequent pairs by its own ids, which order the 256 bytes by their printable
  stand-ins (a space is written ``Ġ``, U+0120, after every letter), while the book takes the
  pair smaller in byte values (a space is 32, before every letter): a pair that starts with a
  space wins a tie under the book's rule and loses it under Hugging Face's;
- encoding the whole text with each trained tokenizer, on the pinned core: ours cold (a fresh
  ``BPETokenizer`` from the same merges, its chunk cache empty), ours warm (the same call
  again: every chunk cached) and tiktoken given the same ranks and pattern; seconds and MB/s of
  UTF-8 input, and the ids must be equal.

Target (issue 36): at least 1,000 merges on Tiny Shakespeare in under 15 s on one core, and at
least 20x faster than the naive trainer.

    python -m benchmarks.tokenizer                      # the real run; appends a row to RESULTS.md
    python -m benchmarks.tokenizer --no-naive --repeat 5
    python -m benchmarks.tokenizer --merges 1000 --pattern gpt4 --no-record
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from itertools import pairwise
from pathlib import Path

import regex

import transformer_lib as tl
from transformer_lib.bpe import _pattern, bpe_merge

from .common import add_record_flags, append_result, format_table, load_average, median

DEFAULT_MERGES = (1000, 4000)
TRAINERS = ("ours", "naive", "tokenizers", "rustbpe")
LABELS = {
    "ours": "ours (tl.train_bpe)",
    "naive": "naive reference",
    "tokenizers": "tokenizers BpeTrainer",
    "rustbpe": "rustbpe",
}
TARGET_SECONDS, TARGET_SPEEDUP = 15.0, 20.0  # issue 36: >= 1,000 merges in < 15 s on one core, >= 20x naive


def naive_train_bpe(text: str, vocab_size: int, pattern: str = "gpt2") -> list[tuple[int, int]]:
    """The merges of ``vocab_size - 256`` steps, each step recounting every pair from scratch;
    ties go to the smaller pair, as in :func:`transformer_lib.train_bpe`."""
    chunks = Counter(regex.findall(_pattern(pattern), text))
    words = [(list(chunk.encode("utf-8")), f) for chunk, f in chunks.items()]
    merges: list[tuple[int, int]] = []
    while len(merges) < vocab_size - 256:
        counts: Counter[tuple[int, int]] = Counter()
        for word, f in words:
            for pair in pairwise(word):
                counts[pair] += f
        if not counts:
            break
        pair = min(counts, key=lambda p: (-counts[p], p))  # the most frequent, then the smaller pair
        new_id = 256 + len(merges)
        merges.append(pair)
        words = [(bpe_merge(word, pair, new_id), f) for word, f in words]
    return merges


def byte_stand_ins() -> dict[int, str]:
    """GPT-2's printable stand-in for each byte, which Hugging Face's byte-level BPE writes: the
    printable bytes stand for themselves, the others (space, controls, ...) take U+0100 onward in
    byte order, so the space is ``Ġ`` (U+0120)."""
    keep = [*range(33, 127), *range(161, 173), *range(174, 256)]
    shifted = [b for b in range(256) if b not in keep]
    return {**{b: chr(b) for b in keep}, **{b: chr(256 + i) for i, b in enumerate(shifted)}}


# ---------------------------------------------------------------------------------------------
# The trainers: each learns ``merges`` merges from ``text`` with the named pre-split pattern
# ---------------------------------------------------------------------------------------------


def train_ours(text: str, merges: int, pattern: str) -> tl.BPETokenizer:
    return tl.train_bpe(text, 256 + merges, pattern)


def train_naive(text: str, merges: int, pattern: str) -> list[tuple[int, int]]:
    return naive_train_bpe(text, 256 + merges, pattern)


def train_tokenizers(text: str, merges: int, pattern: str):
    """Hugging Face ``tokenizers``' BPE trainer with a byte-level pre-tokenizer; returns the trained
    ``tokenizers.Tokenizer``. ``ByteLevel``'s own split is GPT-2's pattern; another pattern is a
    ``Split`` before a ``ByteLevel`` that only maps the bytes."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers

    hf = Tokenizer(models.BPE())
    if pattern == "gpt2":
        hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        hf.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(_pattern(pattern)), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    trainer = trainers.BpeTrainer(
        vocab_size=256 + merges, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    hf.train_from_iterator([text], trainer)
    return hf


def train_rustbpe(text: str, merges: int, pattern: str) -> dict[bytes, int]:
    """``rustbpe``'s trainer; returns its ranks (token bytes -> id), as ``mergeable_ranks`` gives ours."""
    import rustbpe

    tok = rustbpe.Tokenizer()
    tok.train_from_iterator(iter([text]), 256 + merges, pattern=_pattern(pattern))
    return {bytes(b): i for b, i in tok.get_mergeable_ranks()}


TRAIN: dict[str, Callable[[str, int, str], object]] = {
    "ours": train_ours,
    "naive": train_naive,
    "tokenizers": train_tokenizers,
    "rustbpe": train_rustbpe,
}


def tokenizers_merges(hf) -> list[tuple[bytes, bytes]]:
    """The merges of a trained ``tokenizers.Tokenizer`` in order, as pairs of byte strings."""
    unshow = {c: b for b, c in byte_stand_ins().items()}
    out = []
    for m in json.loads(hf.to_str())["model"]["merges"]:
        a, b = m if isinstance(m, list) else m.split(" ")  # newer versions write lists, older "a b"
        out.append((bytes(unshow[c] for c in a), bytes(unshow[c] for c in b)))
    return out


def compare_with_tokenizers(tok: tl.BPETokenizer, hf, text: str) -> dict:
    """How Hugging Face's merges compare with ours: the same pair at the same index, the same pairs
    and the same tokens as sets, and at the first index where the order differs, the two pairs,
    how often each occurs after the merges both learned before it, and their ids in both numberings."""
    ours = [(tok.token_bytes[a], tok.token_bytes[b]) for a, b in tok.merges]
    theirs = tokenizers_merges(hf)
    n = min(len(ours), len(theirs))
    first = next((i for i in range(n) if ours[i] != theirs[i]), None)
    out = {
        "n_ours": len(ours),
        "n_theirs": len(theirs),
        "same_index": sum(ours[i] == theirs[i] for i in range(n)),
        "same_pairs": len(set(ours) & set(theirs)),
        "same_tokens": len({a + b for a, b in ours} & {a + b for a, b in theirs}),
        "first_diff": first,
        "diff": None,
    }
    if first is None:
        return out
    before = tl.BPETokenizer(tok.merges[:first], tok.pattern_name)  # both learned exactly these first
    counts: Counter[tuple[bytes, bytes]] = Counter()
    for chunk, f in Counter(regex.findall(before.pattern, text)).items():
        ids = before.encode_ordinary(chunk)
        for a, b in pairwise(ids):
            counts[before.token_bytes[a], before.token_bytes[b]] += f
    our_ids = {b: i for i, b in enumerate(before.token_bytes)}
    show, hf_vocab = byte_stand_ins(), hf.get_vocab()
    spell = lambda part: "".join(show[x] for x in part)
    pairs = {"ours": ours[first], "tokenizers": theirs[first]}
    out["diff"] = {
        name: {
            "pair": pair,
            "count": counts[pair],
            "our_ids": tuple(our_ids[p] for p in pair),
            "hf_ids": tuple(hf_vocab[spell(p)] for p in pair),
            "stand_ins": tuple(spell(p) for p in pair),
        }
        for name, pair in pairs.items()
    }
    return out


# ---------------------------------------------------------------------------------------------
# One core
# ---------------------------------------------------------------------------------------------


def can_pin() -> bool:
    return hasattr(os, "sched_setaffinity") and hasattr(os, "sched_getaffinity")


def usable_cores() -> set[int]:
    """The cores this process may run on."""
    return set(os.sched_getaffinity(0)) if can_pin() else set(range(os.cpu_count() or 1))


def _thread_ids() -> list[int]:
    try:
        return sorted(int(t) for t in os.listdir("/proc/self/task"))
    except OSError:
        return [0]  # where /proc is missing: the calling thread only


@contextmanager
def pinned(core: int | None) -> Iterator[None]:
    """Every thread of this process (the Rust trainers' worker threads included) on ``core`` for the
    block, then back where it was; ``None`` leaves them. A thread started inside the block inherits
    the pin and afterwards gets the calling thread's cores."""
    if core is None:
        yield
        return
    home = os.sched_getaffinity(0)
    saved = {}
    for tid in _thread_ids():
        try:
            saved[tid] = os.sched_getaffinity(tid)
            os.sched_setaffinity(tid, {core})
        except OSError:  # the thread ended meanwhile
            pass
    try:
        yield
    finally:
        for tid in _thread_ids():
            try:
                os.sched_setaffinity(tid, saved.get(tid, home))
            except OSError:
                pass


def _timed(fn: Callable[[], object]) -> tuple[float, float, object]:
    """Wall-clock seconds, CPU seconds of the whole process (every thread), and what ``fn`` returned."""
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return time.perf_counter() - wall, time.process_time() - cpu, out


# ---------------------------------------------------------------------------------------------
# The benchmark
# ---------------------------------------------------------------------------------------------


def time_encoding(text: str, tok: tl.BPETokenizer, repeat: int, core: int | None) -> dict:
    """Seconds to encode ``text``: ours cold (a fresh tokenizer from the same merges, empty chunk
    cache), ours warm (the same call again) and tiktoken given the same ranks; the ids must agree."""
    import tiktoken

    enc = tiktoken.Encoding(
        f"book-{len(tok.merges)}", pat_str=tok.pattern, mergeable_ranks=tok.mergeable_ranks(), special_tokens={}
    )
    seconds: dict[str, list[float]] = {"ours cold": [], "ours warm": [], "tiktoken": []}
    with pinned(core):
        enc.encode_ordinary(text[:10_000])  # warm-up: the first call compiles tiktoken's regex
        for _ in range(repeat):
            fresh = tl.BPETokenizer(tok.merges, tok.pattern_name)
            ids = {}
            for name, fn in (
                ("ours cold", fresh.encode),
                ("ours warm", fresh.encode),
                ("tiktoken", enc.encode_ordinary),
            ):
                wall, _, ids[name] = _timed(lambda fn=fn: fn(text))
                seconds[name].append(wall)
            if not ids["ours cold"] == ids["ours warm"] == ids["tiktoken"]:
                raise AssertionError(f"{len(tok.merges)} merges: our ids differ from tiktoken's given the same ranks")
    return {"seconds": seconds, "n_ids": len(ids["tiktoken"]), "ids_equal": True}


def run_benchmark(
    text: str,
    merges: tuple[int, ...] = DEFAULT_MERGES,
    *,
    pattern: str = "gpt2",
    repeat: int = 3,
    naive: bool = True,
    naive_repeat: int = 1,
    naive_max: int | None = None,
    core: int | None | str = "auto",
    name: str = "text",
    progress: Callable[[str], None] = lambda message: None,
) -> dict:
    """Train with every trainer at each merge count, check them against ours, time the encoders.

    ``naive_max``: the naive reference runs only at merge counts up to it (``None``: at every one).
    ``core``: the core that the one-core runs are pinned to (``"auto"``: the lowest this process
    may use; ``None``: no pinning, for systems without ``os.sched_setaffinity``). ``progress`` is
    called with a line before each stage."""
    if not merges or min(merges) < 1 or repeat < 1 or naive_repeat < 1:
        raise ValueError(f"merges, repeat and naive_repeat must be positive, got {merges}, {repeat}, {naive_repeat}")
    _pattern(pattern)
    cores = usable_cores()
    if core == "auto":
        core = min(cores) if can_pin() else None
    if core is not None and (not can_pin() or core not in cores):
        raise ValueError(f"cannot pin to core {core}: this process may use cores {sorted(cores)}")
    one = "1" if core is not None else f"{len(cores)} (not pinned)"
    runs = [("ours", one), ("tokenizers", one), ("rustbpe", one)]
    if core is not None and len(cores) > 1:
        runs += [("tokenizers", str(len(cores))), ("rustbpe", str(len(cores)))]
    for trainer in ("ours", "tokenizers", "rustbpe"):  # warm-up on every core: imports, Rust thread pools
        TRAIN[trainer](text[:20_000], 20, pattern)
    loads = []

    def stage(message: str) -> None:  # the load average at every stage: the machine may be shared
        loads.append(load_average())
        progress(message)

    rows = []
    for m in merges:
        wall: dict[tuple[str, str], list[float]] = {run: [] for run in runs}
        cpu: dict[tuple[str, str], list[float]] = {run: [] for run in runs}
        out: dict[tuple[str, str], object] = {}
        for r in range(repeat):
            stage(f"{m} merges: round {r + 1} of {repeat} of ours and the Rust trainers")
            k = r % len(runs)
            for run in runs[k:] + runs[:k]:  # turns, the order rotating every round
                with pinned(core if run[1] == one else None):
                    w, c, out[run] = _timed(lambda run=run: TRAIN[run[0]](text, m, pattern))
                wall[run].append(w)
                cpu[run].append(c)
        run_naive = naive and (naive_max is None or m <= naive_max)
        if run_naive:
            wall["naive", one], cpu["naive", one] = [], []
            for _ in range(naive_repeat):
                stage(f"{m} merges: the naive reference")
                with pinned(core):
                    w, c, out["naive", one] = _timed(lambda: train_naive(text, m, pattern))
                wall["naive", one].append(w)
                cpu["naive", one].append(c)
        tok = out["ours", one]
        if run_naive and out["naive", one] != tok.merges:
            theirs = out["naive", one]
            i = next((i for i, (a, b) in enumerate(zip(theirs, tok.merges, strict=False)) if a != b), None)
            raise AssertionError(f"{m} merges: the naive reference learns other merges than ours (first at {i})")
        for run in runs:
            if run[0] == "rustbpe" and out[run] != tok.mergeable_ranks():
                raise AssertionError(f"{m} merges: rustbpe's ranks ({run[1]} cores) differ from ours")
        stage(f"{m} merges: comparing with tokenizers' order, timing the encoders")
        rows.append({
            "merges": m, "learned": len(tok.merges), "wall": wall, "cpu": cpu,
            "naive_same": True if run_naive else None, "rustbpe_same": True,
            "tokenizers": compare_with_tokenizers(tok, out["tokenizers", one], text),
            "encoding": time_encoding(text, tok, repeat, core),
        })  # fmt: skip
    settings = {
        "data": name, "chars": len(text), "MB": round(len(text.encode("utf-8")) / 1e6, 3), "pattern": pattern,
        "merges": "/".join(map(str, merges)), "repeat": repeat, "naive": _naive_setting(naive, naive_repeat, naive_max),
        "pinned_core": "none" if core is None else core, "cores": len(cores),
    }  # fmt: skip
    n_bytes = len(text.encode("utf-8"))
    return {"settings": settings, "one": one, "rows": rows, "n_bytes": n_bytes, "load": [*loads, load_average()]}


def _naive_setting(naive: bool, repeat: int, up_to: int | None) -> str:
    if not naive:
        return "skipped"
    return f"{repeat} run{'s' if repeat > 1 else ''}" + ("" if up_to is None else f" up to {up_to} merges")


# ---------------------------------------------------------------------------------------------
# The report
# ---------------------------------------------------------------------------------------------


def _spread(values: list[float], fmt: str = ".2f") -> str:
    if len(values) == 1:
        return format(values[0], fmt)
    return f"{format(median(values), fmt)} ({format(min(values), fmt)}..{format(max(values), fmt)})"


def _pair(pair: tuple[bytes, bytes]) -> str:
    return " + ".join(repr(p.decode("utf-8", "replace")) for p in pair)


def speedup(row: dict) -> float | None:
    """Median naive time / median time of ours (wall clock, both on one core)."""
    naive = [v for (name, _), v in row["wall"].items() if name == "naive"]
    ours = next(v for (name, _), v in row["wall"].items() if name == "ours")
    return median(naive[0]) / median(ours) if naive else None


def explain_first_difference(cmp: dict) -> str:
    """One paragraph: where Hugging Face's order first differs from ours, and why (a tie)."""
    if cmp["first_diff"] is None:
        return "the same merges in the same order"
    d, i = cmp["diff"], cmp["first_diff"]
    o, t = d["ours"], d["tokenizers"]
    text = (
        f"first difference at merge {i}: ours {_pair(o['pair'])} (byte ids {o['our_ids']}), tokenizers "
        f"{_pair(t['pair'])} (byte ids {t['our_ids']}); counts there {o['count']:,} and {t['count']:,}"
    )
    if o["count"] != t["count"]:
        return text + ": not a tie"
    text += (
        f": a tie. The book takes the pair smaller in byte ids, {o['our_ids']} < {t['our_ids']}; tokenizers "
        f"takes the pair smaller in its own ids, which order bytes by their printable stand-ins "
        f"({' + '.join(t['stand_ins'])} is {t['hf_ids']} < {' + '.join(o['stand_ins'])} {o['hf_ids']})"
    )
    byte = o["pair"][0][0]
    if (shown := byte_stand_ins()[byte]) != chr(byte):
        text += f"; byte {byte} ({chr(byte)!r}) is written {shown!r} (U+{ord(shown):04X}), after every printable ASCII"
    return text


def report(result: dict) -> str:
    s, one = result["settings"], result["one"]
    rows = []
    for row in result["rows"]:
        ours = median(row["wall"]["ours", one])
        order = sorted(row["wall"], key=lambda run: (TRAINERS.index(run[0]), run[1] != one))
        for run in order:
            walls, cpus = row["wall"][run], row["cpu"][run]
            rows.append([f"{row['merges']:,}", LABELS[run[0]], run[1], _spread(walls), _spread(cpus),
                         len(walls), f"{median(walls) / ours:.2f}x"])  # fmt: skip
    headers = ["merges", "trainer", "cores", "wall s", "CPU s", "runs", "time / ours"]
    lines = [
        f"{s['data']}: {s['chars']:,} characters, {s['MB']} MB; pattern {s['pattern']}; "
        f"one-core runs pinned to core {s['pinned_core']} of {s['cores']} (every thread of the process); "
        f"one-minute load average {_loads(result['load'])}",
        "",
        "training (median wall time over the runs, lowest..highest; CPU s: all threads of the process)",
        format_table(headers, rows),
        "",
    ]
    for row in result["rows"]:
        m, cmp = row["merges"], row["tokenizers"]
        lines.append(f"{m:,} merges:")
        if row["naive_same"] is not None:
            lines.append(f"  naive reference == ours: the same {row['learned']:,} merges in the same order")
        lines.append("  rustbpe ranks == ours: equal (every run)")
        lines.append(
            f"  tokenizers vs ours: {cmp['same_index']:,}/{cmp['n_ours']:,} the same merge at the same index; "
            f"{cmp['same_pairs']:,}/{cmp['n_ours']:,} the same pairs as a set; {cmp['same_tokens']:,}/"
            f"{cmp['n_ours']:,} the same tokens as a set"
        )
        lines.append("  " + explain_first_difference(cmp))
        up, ours = speedup(row), median(row["wall"]["ours", one])
        if m >= 1000:
            met = "met" if ours < TARGET_SECONDS else "NOT met"
            target = f"  target: ours < {TARGET_SECONDS:.0f} s on one core: {ours:.2f} s ({met})"
            if up is not None:
                met = "met" if up >= TARGET_SPEEDUP else "NOT met"
                target += f"; naive / ours >= {TARGET_SPEEDUP:.0f}: {up:.1f}x ({met})"
            lines.append(target)
        elif up is not None:
            lines.append(f"  naive / ours: {up:.1f}x")
    enc_rows = []
    mb = result["n_bytes"] / 1e6
    for row in result["rows"]:
        e = row["encoding"]
        for name, secs in e["seconds"].items():
            enc_rows.append([f"{row['merges']:,}", name, _spread(secs, ".3f"), f"{mb / median(secs):.2f}",
                             f"{e['n_ids']:,}", "yes" if e["ids_equal"] else "NO"])  # fmt: skip
    lines += [
        "",
        "encoding the whole text on one core (ours cold: a fresh tokenizer, empty chunk cache; warm: the "
        "same call again; tiktoken given the same ranks)",
        format_table(["merges", "encoder", "s", "MB/s", "ids", "ids equal"], enc_rows),
    ]
    return "\n".join(lines)


def _loads(values: list[float | None]) -> str:
    """The load averages seen during the run: at the start, the highest, at the end."""
    known = [v for v in values if v is not None]
    if not known:
        return "unknown"
    return f"{known[0]:.2f} at the start, {max(known):.2f} at most, {known[-1]:.2f} at the end"


def record(result: dict, path: str | None) -> Path:
    """Append the run's dated row to the results file."""
    one, results = result["one"], {}
    for row in result["rows"]:
        m = row["merges"]
        for (name, cores), walls in row["wall"].items():
            key = name if cores == one else f"{name}_{cores}cores"
            results[f"{key}_s@{m}"] = f"{median(walls):.3g}"
        results[f"ours_cpu_s@{m}"] = f"{median(row['cpu']['ours', one]):.3g}"
        if (up := speedup(row)) is not None:
            results[f"naive/ours@{m}"] = f"{up:.1f}x"
        cmp = row["tokenizers"]
        results[f"hf_same_index@{m}"] = f"{cmp['same_index']}/{cmp['n_ours']}"
        results[f"hf_same_set@{m}"] = f"{cmp['same_pairs']}/{cmp['n_ours']}"
        if cmp["first_diff"] is not None:
            d = cmp["diff"]
            results[f"hf_first_diff@{m}"] = (
                f"{cmp['first_diff']}: ours {_pair(d['ours']['pair'])} / hf {_pair(d['tokenizers']['pair'])} "
                f"(tie {d['ours']['count']}={d['tokenizers']['count']})"
            )
        for name, secs in row["encoding"]["seconds"].items():
            results[f"{name.replace(' ', '_')}_MB_s@{m}"] = f"{result['n_bytes'] / 1e6 / median(secs):.2f}"
    checked = [m for m in result["rows"] if m["naive_same"] is not None]
    results["naive_same"] = "/".join(str(r["merges"]) for r in checked) if checked else "-"
    results["rustbpe_same"] = True
    results["ids_equal_tiktoken"] = True
    results["target"] = f"ours@>=1000<{TARGET_SECONDS:.0f}s on 1 core, naive/ours>={TARGET_SPEEDUP:.0f}"
    known = [v for v in result["load"] if v is not None]
    span = f"{min(known):.2f}..{max(known):.2f}" if known else "?"
    settings = {**result["settings"], "load_during_run": span}
    return append_result("tokenizer", settings, results, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.tokenizer",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--data", default=None, metavar="FILE", help="a UTF-8 text; None: Tiny Shakespeare")
    parser.add_argument("--merges", type=int, nargs="+", default=list(DEFAULT_MERGES), help="merge counts to learn")
    parser.add_argument("--pattern", choices=sorted(tl.PATTERNS), default="gpt2", help="the pre-split pattern")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs of each trainer and encoder (median)")
    parser.add_argument(
        "--naive", action=argparse.BooleanOptionalAction, default=True, help="time the naive reference (minutes)"
    )
    parser.add_argument("--naive-repeat", type=int, default=1, help="timed runs of the naive reference")
    parser.add_argument(
        "--naive-max", type=int, default=None, metavar="N", help="run the naive reference only up to N merges"
    )
    parser.add_argument(
        "--core", type=int, default=None, help="the core of the one-core runs; None: the lowest allowed"
    )
    parser.add_argument("--no-pin", action="store_true", help="pin nothing (the one-core runs use every core)")
    add_record_flags(parser)
    args = parser.parse_args(argv)
    if min(args.merges) < 1 or args.repeat < 1 or args.naive_repeat < 1:
        parser.error("--merges, --repeat and --naive-repeat must be positive")
    if args.no_pin:
        core = None
    elif not can_pin():
        print("os.sched_setaffinity is missing here: nothing is pinned, the one-core runs use every core")
        core = None
    elif args.core is None:
        core = "auto"
    elif args.core not in usable_cores():
        parser.error(f"--core {args.core}: this process may use cores {sorted(usable_cores())}")
    else:
        core = args.core
    path = Path(args.data) if args.data else tl.data.SHIPPED_PATH
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        parser.error(f"--data {path}: {e}")
    merges = tuple(sorted(set(args.merges)))
    result = run_benchmark(
        text, merges, pattern=args.pattern, repeat=args.repeat, naive=args.naive, naive_repeat=args.naive_repeat,
        naive_max=args.naive_max, core=core, name="tinyshakespeare" if args.data is None else path.name,
        progress=lambda message: print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True),
    )  # fmt: skip
    print(report(result))
    if not args.no_record:
        print(f"\nappended to {record(result, args.results)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
