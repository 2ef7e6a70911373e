"""The ``evaluate`` command (chapter "Measuring a model"): ``python -m transformer_lib evaluate
--ckpt RUN`` prints a run's report card (:func:`~transformer_lib.evaluate.report_card`), a Markdown
table of the loss on held-out text in three units, multiple choice, and for a fine-tuned model
exact match and pass@k, each with its 95 % interval; ``--compare RUN2`` adds a second run scored on
the same items, ``--quantize int8`` the run's quantised copy; ``--json FILE`` writes the cards.

lm-eval's names mean the same here: ``--tasks`` (a comma list of the book's tasks), ``--limit N``
(items of each task, as ``--items``) and ``--output_path`` (the cards as JSON, a card it wrote
before replaced, any other file only with ``--force``). lm-eval's flags that mean something else
here (``--model``, ``--model_args``, ``--num_fewshot``, ``--batch_size``, ...) are refused with
the flag to use (:data:`LM_EVAL_REFUSED`).

What is scored, unless a flag says otherwise:

- **text**: the run's validation split, the last ``val_fraction`` of the text file its record names
  (a fine-tuning run: its base's), if that file is there and unchanged; else the shipped Tiny
  Shakespeare from ``tl.data.mc_tasks.HELD_OUT_START`` (91 % of its characters)
  on, the part no shipped model trained on (later, if a run kept less of it for validation);
- **tasks**: ``speaker`` and ``cloze`` (:mod:`~transformer_lib.data.mc_tasks`), 100 items each,
  from that held-out part of the shipped Tiny Shakespeare;
- **exact match**, only when a run is fine-tuned (or given ``--adapter``): 200 dates in chapter
  "Fine-tuning"'s formats, drawn with the seed ``DATES_SEED``, none of them a training date of chapter "Fine-tuning" or
  of the README (drawn with 0) or a date of the pairs files that the runs' records name.

The cards are computed on the CPU, where ``report_card`` builds its inputs: ``--device auto``
picks it, and another device is refused.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..checkpoint import CHECKPOINT_NAME, checkpoint_file, read_checkpoint
from ..data import SHIPPED_PATH, load_corpus, sha256_of
from ..data import TINY_SHAKESPEARE_SHA256 as SHAKESPEARE
from ..data.instructions import date_pairs, read_pairs
from ..data.mc_tasks import HELD_OUT_START, cloze_task, held_out_text, speaker_choice_task
from ..evaluate import format_cards, report_card
from ..lora import lora_weights, remove_lora
from ..models import GPT
from ..quantize import QUANT_METHODS, quantize_weights
from ..run import ADAPTER_NAME, RunRecord, read_record, start_model
from ..token_rows import remove_token_rows, token_rows
from ..utils import atomic_write, pick_device
from .settings import Parser, check_seed

__all__ = ["DATES_SEED", "DATE_FORMATS", "LM_EVAL_REFUSED", "TASKS", "build_parser", "evaluate_main"]

#: The multiple-choice tasks by name: ``(text, n_items, start_fraction) -> items``.
TASKS = {
    "speaker": lambda text, n, start: speaker_choice_task(text, n, start_fraction=start),
    "cloze": lambda text, n, start: cloze_task(text, n, start_fraction=start),
}
DATE_FORMATS = ("dd.mm.yyyy", "yyyy.mm.dd", "mm/dd/yyyy")  # chapter "Fine-tuning"'s (the README's pairs.jsonl)
DATES_SEED = 16  # --dates: not 0, the seed of chapter "Fine-tuning"'s (and the README's) training pairs
#: what a file written by --output-path (and --json) says of itself: such a file is a card to replace
STAMP = "python -m transformer_lib evaluate"
CARD_NAME = "report_card.json"  # the file --output-path writes in a folder
#: lm-eval's flags that mean something else here: why, and the flag to give instead
LM_EVAL_REFUSED = {
    "--model": "is lm-eval's kind of model (hf, vllm, ...); the book scores its own runs: give the run's folder or "
    "checkpoint with --ckpt (and a LoRA adapter file with --adapter)",
    "--model-args": "is lm-eval's pretrained=PATH,dtype=...; the book reads a run's own folder or checkpoint, on "
    "the CPU: give it with --ckpt (and a LoRA adapter file with --adapter)",
    "--num-fewshot": "puts solved examples before each question in lm-eval; the book's tasks are zero-shot, each "
    "item's context alone: leave it out",
    "--batch-size": "is lm-eval's batch of requests; the report card batches each item's choices and the prompts of "
    "one length itself: leave it out (--threads sets the CPU threads)",
    "--gen-kwargs": "is lm-eval's key=value settings of generation; here they are flags of their own: give "
    "--temperature, --max-new-tokens and --samples",
    "--log-samples": "keeps every item's scores in lm-eval; the book's JSON card always holds them (its \"items\"): "
    "give --output-path FILE",
    "--include-path": "is lm-eval's folder of task files; the book has its own tasks (speaker, cloze): give --tasks, "
    "or write them out for lm-eval with transformer_lib.data.write_lm_eval_task",
}
EPILOG = ("Every flag may be spelt with underscores (--output_path, --max_new_tokens), as lm-eval and Hugging Face "
          "write them; no flag is abbreviated. lm-eval's --tasks, --limit and --output_path mean the same here; its "
          f"{', '.join('--' + f[2:].replace('-', '_') for f in LM_EVAL_REFUSED)} mean something else and are "
          "refused, each with the flag to use.")  # fmt: skip
NOTE = ("Each score is the mean over its items, with a 95 % interval in brackets (Wilson's for a share of items, a "
        "bootstrap over windows of text for bits per byte, over prompts for pass@k); \"better\" says which way each "
        "row improves.")  # fmt: skip
TOLD_APART = ('difference: the first column minus the second, on the same items, with its paired 95 % interval; '
              'told apart "yes" where that interval leaves out 0. A "no" says that these items cannot tell the two '
              "apart, not that they are equal.")  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    """The evaluation command's argument parser (``python -m transformer_lib evaluate --help``, chapter "Measuring a
    model")."""
    p = Parser(
        prog="python -m transformer_lib evaluate",
        epilog=EPILOG,
        refused=LM_EVAL_REFUSED,
        description='Print a run\'s report card (chapter "Measuring a model"): loss, perplexity and bits per byte on '
        "held-out text, multiple-choice accuracy, and for a fine-tuned model exact match and pass@k, each with a 95 % "
        "interval; with --compare, a second run on the same items, the difference and whether the items tell them "
        "apart.",
    )
    # fmt: off
    p.add_argument("--ckpt", required=True, help="a run's folder or checkpoint file, of train or finetune (required)")
    p.add_argument("--adapter", metavar="FILE", help="a LoRA adapter file of finetune, added to --ckpt, the base it "
                   "was trained on (default: none)")
    p.add_argument("--compare", metavar="CKPT2", help="a second run, scored on the same items (default: none)")
    p.add_argument("--compare-adapter", metavar="FILE", help="a LoRA adapter file added to --compare (default: none)")
    p.add_argument("--text", metavar="FILE", help="held-out text for the loss, all of the file (default: the run's "
                   "validation split of the text it trained on, else the shipped Tiny Shakespeare from "
                   f"{HELD_OUT_START * 100:.0f} %% of its characters on, which no shipped model trained on)")
    p.add_argument("--tasks", default="speaker,cloze", help=f"multiple-choice tasks from the shipped text's held-out "
                   f"part: a comma list of {', '.join(TASKS)}, or none (default: %(default)s)")
    items = p.add_mutually_exclusive_group()
    items.add_argument("--items", type=int, default=100, help="items of each task (default: %(default)s)")
    items.add_argument("--limit", type=float, metavar="N", help="lm-eval's name of --items: N items of each task, a "
                       "whole number (the book's tasks are drawn, with no fixed total to take a share of)")
    exact = p.add_mutually_exclusive_group()
    exact.add_argument("--pairs", metavar="FILE.jsonl", help="prompt/response pairs for exact match (default: none)")
    exact.add_argument("--dates", type=int, metavar="N", help="N date pairs for exact match, none of whose dates the "
                       "runs were fine-tuned on (default: 200 if a run is fine-tuned, else none)")
    p.add_argument("--samples", type=int, default=0, help="answers sampled per prompt, for pass@1 and pass@k "
                   "(default: 0, none)")
    p.add_argument("--temperature", type=float, default=0.3, help="of those samples (default: %(default)s)")
    p.add_argument("--k", type=int, help="the k of pass@k, at most --samples (default: 8, or --samples if fewer)")
    p.add_argument("--quantize", action="append", metavar="METHOD", help="also score the run's int8 or nf4 copy "
                   "(repeat the flag or give a comma list; default: none)")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", metavar="FILE", help="also write the cards as JSON to FILE, or - for stdout (the "
                     "table then goes to stderr); an existing file only with --force (default: none)")
    out.add_argument("--output-path", metavar="PATH", help=f"lm-eval's name: also write the cards as JSON to the "
                     f"file PATH, or to PATH/{CARD_NAME} if PATH is a folder; a card this command wrote is "
                     "replaced, any other file only with --force (default: none)")
    p.add_argument("--force", action="store_true", help="replace an existing --json or --output-path file "
                   "(default: refuse)")
    p.add_argument("--seed", type=int, default=0, help="seed of the sampled answers (default: %(default)s)")
    p.add_argument("--device", default="auto", help="'auto' or 'cpu': the report card is computed on the CPU "
                   "(default: %(default)s)")
    p.add_argument("--max-new-tokens", type=int, default=16, help="the longest answer (default: %(default)s)")
    # fmt: on
    return p


@dataclass
class _Run:
    """One run, a column of the table: its model and tokenizer, and what it is."""

    name: str
    path: str  # the checkpoint, as given
    adapter: str | None
    kind: str
    model: GPT
    tokenizer: object
    pretraining: RunRecord | None  # what its weights were pretrained on: its own record, or its base's
    pairs_file: str | None  # the pairs it was fine-tuned on
    finetuned: bool
    label: str  # the checkpoint and adapter, as given


def _load(path: str, adapter: str | None, flags=("--ckpt", "--adapter")) -> _Run:
    """The run at ``path`` (of any kind that ``train`` and ``finetune`` write), with the LoRA ``adapter`` added."""
    file = checkpoint_file(path)
    if not file.is_file():
        raise FileNotFoundError(f"{flags[0]}: no checkpoint at {file}")
    if adapter is not None and not Path(adapter).is_file():
        raise FileNotFoundError(f"{flags[1]}: no adapter file at {adapter}")
    ckpt = read_checkpoint(file)
    if str(ckpt.get("format", "")).startswith("transformer_lib.lora"):
        raise ValueError(f"{file} is a LoRA adapter file: give its base with {flags[0]} and the file with {flags[1]}")
    record = RunRecord.from_checkpoint(ckpt)
    if adapter is not None and record.method == "lora":
        raise ValueError(f"{file} is a LoRA run, its adapters already in it: leave out {flags[1]}, or give its base")
    model, tokenizer = start_model(ckpt, file, adapter)  # the adapter file's adapters added
    if not isinstance(model, GPT) or tokenizer is None:
        raise ValueError(f"{file} does not hold a GPT with its tokenizer")
    kind = {None: "pretraining run", "full": "full fine-tuning run", "lora": "LoRA fine-tuning run"}[record.method]
    if record.kind in ("dpo", "grpo"):  # chapter "Preferences and rewards"'s tuning runs
        kind = f"{record.kind.upper()} run ({'LoRA' if record.method == 'lora' else 'every weight'})"
    pairs_file = record.data if record.kind in ("finetune", "grpo") else None
    if adapter is not None:
        kind, pairs_file = kind + " + LoRA adapter", (read_checkpoint(adapter).get("meta") or {}).get("data")
    name = file.resolve().parent.name if file.name == CHECKPOINT_NAME else file.stem
    if adapter is not None:
        given = Path(adapter).resolve()
        name += " + " + (given.parent.name if given.name == ADAPTER_NAME else given.stem)
    finetuned = adapter is not None or record.kind != "pretrain"
    label = path + (f" + {adapter}" if adapter else "")
    return _Run(name, path, adapter, kind, model, tokenizer, _pretraining(record), pairs_file, finetuned, label)


def _pretraining(record: RunRecord) -> RunRecord | None:
    """The record of the pretraining run under ``record`` (itself, or a fine-tuning run's base), if still there."""
    for _ in range(8):  # a fine-tuning run's base may be fine-tuned too
        if record.kind == "pretrain":
            return record
        if not record.base or not checkpoint_file(record.base).is_file():
            return None
        record = read_record(record.base)
    return None


def _text(given: str | None, runs: list[_Run], start: float) -> tuple[str, str]:
    """The held-out text and what to call it (see the module's docstring)."""
    if given is not None:
        try:
            return Path(given).read_bytes().decode("utf-8-sig"), f"{given} (all of it)"
        except UnicodeDecodeError as e:
            raise ValueError(f"--text {given} is not UTF-8 text (byte {e.start})") from None
    note, first = "", runs[0].pretraining
    if first is not None and first.data and first.val_fraction:
        path = Path(first.data)
        if path.is_file():
            text = load_corpus(path).text
            if first.data_sha256 in (None, sha256_of(text.encode())):
                return held_out_text(text, 1.0 - first.val_fraction), f"the last {first.val_fraction:.0%} of {path}"
        note = f" ({path}, which {runs[0].name} trained on, is {'changed' if path.is_file() else 'not there'})"
    text = SHIPPED_PATH.read_text(encoding="utf-8")
    return held_out_text(text, start), f"the last {1 - start:.0%} of the shipped Tiny Shakespeare{note}"


def _held_out_start(runs: list[_Run]) -> float:
    """Where the held-out part of the shipped text starts for ``runs``, a fraction of its characters:
    at ``HELD_OUT_START``, after every shipped model's training split, or later where one of
    ``runs`` trained on the shipped text and kept less of it for validation."""
    kept = [r.pretraining.val_fraction for r in runs if r.pretraining and r.pretraining.data_sha256 == SHAKESPEARE]
    return max([HELD_OUT_START] + [1.0 - v for v in kept if v])


def _items(tasks: list[str], n: int, start: float, flag: str = "--items") -> dict:
    """``n`` items of each task, from the shipped text's held-out part (``flag``: the flag that gave ``n``)."""
    text = SHIPPED_PATH.read_text(encoding="utf-8")
    try:
        return {name: TASKS[name](text, n, start) for name in tasks}
    except ValueError as e:
        raise ValueError(f"{flag} {n}: {e}") from None


def _check_inputs(run: _Run, text: str, label: str, items: dict) -> None:
    """Refuse a text that the run's tokenizer cannot encode, or too short for an interval, and a
    choice longer than the run's context (lm-eval's rule: a choice is never cropped, a context is)."""
    T = run.model.config.context_len
    try:
        n = len(run.tokenizer.encode(text))
    except ValueError as e:
        raise ValueError(f"the text ({label}) for {run.name}: {e}") from None
    if n < T + 2:
        raise ValueError(f"the text ({label}) is {n} tokens of {run.name}: too short for two windows of its context "
                         f"({T} tokens) and an interval, {T + 2} at least")  # fmt: skip
    for name, task in items.items():
        try:
            longest = max(len(run.tokenizer.encode(" " + c)) for item in task for c in item.choices)
        except ValueError as e:
            raise ValueError(f"the {name} task for {run.name}: {e}: leave the task out (--tasks)") from None
        if longest > T:
            raise ValueError(f"the {name} task's choices are up to {longest} tokens of {run.name}, more than its "
                             f"context ({T} tokens): leave the task out (--tasks)")  # fmt: skip


def _names(spec: str, known, flag: str) -> list[str]:
    """The names of a comma list, each one of ``known`` (``none``: none)."""
    names = [n.strip() for n in spec.split(",") if n.strip()]
    bad = [n for n in names if n not in known] if names != ["none"] else []
    if bad or not names:
        raise ValueError(f"{flag}: unknown name {(bad or [spec])[0]!r}; the choices: {', '.join(known)} (or none)")
    return [] if names == ["none"] else list(dict.fromkeys(names))


def _is_card(path: Path) -> bool:
    """Whether the file at ``path`` is a report card this command wrote (its JSON says so)."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    return isinstance(doc, dict) and doc.get("written_by") == STAMP


def _output_file(path: str, force: bool) -> Path:
    """The file ``--output-path PATH`` writes: PATH, or PATH/report_card.json where PATH is a folder.
    Refused where its folder is missing, and where it would replace a file that is not a card this
    command wrote, unless ``force``."""
    out = Path(path)
    if out.is_dir():
        out = out / CARD_NAME
    elif path.endswith(("/", "\\")):
        raise FileNotFoundError(f"--output-path {path}: there is no folder {path}")
    if not out.parent.is_dir():
        raise FileNotFoundError(f"--output-path {path}: there is no folder {out.parent}")
    if out.is_dir():
        raise FileExistsError(f"--output-path {path}: {out} is a folder; give a file or another folder")
    if out.exists() and not force and not _is_card(out):
        raise FileExistsError(f"--output-path {out} exists and is not a report card of this command: give --force "
                              "to replace it, or another path")  # fmt: skip
    return out


def _check(args) -> tuple[list[str], list[str]]:
    """Refuse bad numbers, names and files before any model is read; the tasks and quantisation methods."""
    check_seed(args.seed)
    args.items_flag = "--items"
    if args.limit is not None:  # lm-eval's name of --items; below 1, lm-eval's share of a task's items
        if not (math.isfinite(args.limit) and args.limit >= 1 and args.limit == int(args.limit)):
            raise ValueError(f"--limit must be a whole number of items >= 1, got {args.limit:g}: the book's tasks "
                             "are drawn from the held-out text, with no fixed total to take a share of")  # fmt: skip
        args.items, args.items_flag = int(args.limit), "--limit"
    for flag, value, least in (("--items", args.items, 1), ("--samples", args.samples, 0), ("--k", args.k, 1),
                               ("--max-new-tokens", args.max_new_tokens, 1), ("--dates", args.dates, 1)):  # fmt: skip
        if value is not None and value < least:
            raise ValueError(f"{flag} must be an int >= {least}, got {value}")
    if not (math.isfinite(args.temperature) and args.temperature > 0):
        raise ValueError(f"--temperature must be a number > 0 (0.3 suits the book's models), got {args.temperature}")
    k_given, args.k = args.k is not None, min(8, args.samples or 8) if args.k is None else args.k
    if args.k > args.samples and (args.samples or k_given):
        raise ValueError(f"--k {args.k} needs at least k answers per prompt: give --samples {args.k} or more")
    if args.compare_adapter and not args.compare:
        raise ValueError("--compare-adapter is added to the run of --compare: give --compare CKPT2 too")
    for flag, path in (("--text", args.text), ("--pairs", args.pairs)):
        if path is not None and (not Path(path).exists() or Path(path).is_dir()):
            raise FileNotFoundError(f"{flag}: no file at {path}")
    if args.json not in (None, "-"):
        out = Path(args.json)
        if not out.parent.is_dir():
            raise FileNotFoundError(f"--json {out}: there is no folder {out.parent}")
        if out.is_dir() or (out.exists() and not args.force):
            raise FileExistsError(f"--json {out} exists: give --force to replace it, or another file")
    args.output_file = None if args.output_path is None else _output_file(args.output_path, args.force)
    if pick_device(args.device).type != "cpu" and args.device != "auto":
        raise ValueError(f"--device {args.device}: the report card is computed on the CPU; give --device cpu or auto")
    methods = list(dict.fromkeys(m for spec in args.quantize or [] for m in _names(spec, QUANT_METHODS, "--quantize")))
    return _names(args.tasks, list(TASKS), "--tasks"), methods


def _dates(n: int, runs: list[_Run]) -> tuple[list[tuple[str, str]], str]:
    """``n`` date pairs in :data:`DATE_FORMATS`, none of whose dates is one of chapter "Fine-tuning"'s training
    dates (the README's too) or in a pairs file that one of ``runs`` was fine-tuned on."""
    seen, read = (
        {r for _, r in date_pairs(2400, seed=0, formats=DATE_FORMATS)},
        ['the training pairs of chapter "Fine-tuning"'],
    )
    for run in runs:
        if run.pairs_file and Path(run.pairs_file).is_file():
            try:
                seen |= {response for _, response in read_pairs(run.pairs_file)}
                read.append(Path(run.pairs_file).name)
            except ValueError:  # no longer a pairs file: nothing to leave out
                pass
    drawn = [p for p in date_pairs(2 * n + len(seen), seed=DATES_SEED, formats=DATE_FORMATS) if p[1] not in seen]
    if len(drawn) < n:
        raise ValueError(f"--dates {n}: only {len(drawn)} dates are not in the runs' training pairs")
    which = " or ".join(dict.fromkeys(read))
    return drawn[:n], f'{n} dates in the formats of chapter "Fine-tuning" (seed {DATES_SEED}), none in {which}'


def _pairs(args, runs: list[_Run]) -> tuple[list | None, str]:
    """The exact-match pairs and what to call them (None: no exact match)."""
    asked = args.pairs is not None or args.dates is not None
    if not asked and not any(r.finetuned for r in runs):
        if args.samples:
            raise ValueError("--samples answers prompts: give --pairs FILE.jsonl or --dates N")
        return None, ""
    no_end = next((r for r in runs if getattr(r.tokenizer, "eos_id", None) is None), None)
    if asked and no_end is not None:
        raise ValueError(f"exact match needs a tokenizer with an end token, so that an answer can stop: {no_end.label} "
                         f"is a character run, which has none; leave out --pairs and --dates")  # fmt: skip
    if args.pairs is not None:
        pairs = read_pairs(args.pairs)
        return pairs, f"{len(pairs)} pairs of {args.pairs}"
    return _dates(200 if args.dates is None else args.dates, runs)


def _quantised(run: _Run, method: str) -> tuple[GPT, dict]:
    """The run's model quantised by ``method``; a LoRA model's adapters (and token rows) merged first."""
    model = run.model
    if lora_weights(model) or token_rows(model) is not None:  # a fresh copy, merged
        model = _load(run.path, run.adapter).model
        remove_lora(model)  # none: nothing to do
        if token_rows(model) is not None:
            remove_token_rows(model)
    return quantize_weights(model, method)


def _report(runs: list[_Run], cards: dict, reports: dict, scored: str) -> list[str]:
    """The lines to print: one per run, what was scored, the table and how to read it, the memory."""
    lines = []
    for run in runs:
        tok = f"{'BPE' if run.tokenizer.kind == 'bpe' else 'character'} tokenizer of {run.tokenizer.vocab_size}"
        lines.append(f"{run.name}: {run.label}, {run.kind}, {tok}, {cards[run.name]['params']:,} parameters")
    lines += [f"scored on: {scored}", "", format_cards(cards), "", NOTE] + ([TOLD_APART] if len(cards) == 2 else [])
    merged = " (its adapters merged into the weights first)" if lora_weights(runs[0].model) else ""
    for name, r in reports.items():
        before, after = r["bytes_before"], r["bytes_after"]
        n, bits = len(r["weights_quantised"]), r["bits_per_weight"]
        lines.append(f"{name}: the weights take {after:,} bytes instead of {before:,} ({after / before:.0%}); {n} "
                     f"matrices at {bits:.2f} bits a weight{merged}")  # fmt: skip
    return lines


def evaluate_main(argv: Sequence[str] | None = None) -> int:
    """``python -m transformer_lib evaluate``: print a run's report card (chapter "Measuring a model")."""
    args = build_parser().parse_args(argv)
    tasks, methods = _check(args)
    runs = [_load(args.ckpt, args.adapter)]
    if args.compare:
        runs.append(_load(args.compare, args.compare_adapter, ("--compare", "--compare-adapter")))
        if runs[1].name == runs[0].name:  # two folders of one name: their paths; one run twice: A and B
            runs[0].name, runs[1].name = (runs[0].label, runs[1].label) if runs[0].label != runs[1].label else "AB"
    start = _held_out_start(runs)  # the shipped text no run trained on
    text, scored = _text(args.text, runs, start)
    items = _items(tasks, args.items, start, args.items_flag)
    pairs, pairs_label = _pairs(args, runs)
    for run in runs:
        _check_inputs(run, text, scored, items)
    scored += "; " + (", ".join(f"{name} ({len(v)} items)" for name, v in items.items()) or "no multiple choice")
    scored += f"; exact match: {pairs_label}" if pairs is not None else ""
    options = dict(text=text, tasks=items, samples=args.samples, temperature=args.temperature, k=args.k,
                   max_new_tokens=args.max_new_tokens, seed=args.seed)  # fmt: skip
    cards, reports = {}, {}
    for run, method in [(runs[0], None), *((runs[0], m) for m in methods), *((r, None) for r in runs[1:])]:
        name = run.name if method is None else f"{run.name} {method}"
        print(f"scoring {name} ...", file=sys.stderr, flush=True)
        model = run.model
        if method is not None:
            model, reports[name] = _quantised(run, method)
        has_end = getattr(run.tokenizer, "eos_id", None) is not None  # a character run: no exact match
        cards[name] = report_card(model, run.tokenizer, pairs=pairs if has_end else None, **options)
    out = sys.stderr if args.json == "-" else sys.stdout  # stdout then holds the JSON alone
    print("\n".join(_report(runs, cards, reports, scored)), file=out)
    if args.json is not None or args.output_file is not None:
        described = {run.name: {"ckpt": run.path, "adapter": run.adapter, "kind": run.kind} for run in runs}
        doc = {"written_by": STAMP, "runs": described, "scored": scored, "cards": cards, "quantized": reports}
        dumped = json.dumps(doc, indent=1)
        if args.json == "-":
            print(dumped)
        else:
            file = args.json if args.output_file is None else args.output_file
            atomic_write(file, lambda tmp: Path(tmp).write_text(dumped + "\n", encoding="utf-8"))
            print(f"wrote the cards to {file}", file=out)
    return 0
