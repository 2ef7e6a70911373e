"""The experiment over seeds of chapter "Measuring a model": the report card (:func:`transformer_lib.report_card`) of
the models of chapter "Fine-tuning", before and after fine-tuning, and of each one quantised. The chapter reads
the record, ``transformer_lib/data/ch16/report_cards.json`` (``recorded("measuring_a_model")``).

The command line (``--dry-run`` prints and writes nothing)::

    # three seeds (about 15 minutes, 1 core)
    python -m transformer_lib.experiments measuring_a_model
    # seed 0, printed, nothing written
    python -m transformer_lib.experiments measuring_a_model --seeds 0 --dry-run

Two parts. ``lm_eval`` (needs ``lm-eval``, from ``requirements-eval.txt``): the two shipped
models of Shakespeare (chapter "Fine-tuning"'s BPE base and chapter "What attention learns"'s character model), written
out by
:func:`transformer_lib.export_hf` and scored by ``lm-eval`` in float64 on the first
:data:`LM_EVAL_ITEMS` items of both tasks, from the task files
:func:`transformer_lib.data.write_lm_eval_task` writes: its ``acc``, ``acc_norm`` and every
log-likelihood, which the chapter compares with the book's own scores.

``cards``: the base is the book's shipped model (chapter "Fine-tuning"'s, in float32). For each
seed it is fine-tuned on chapter "Fine-tuning"'s dates as chapter "Fine-tuning"'s sweep does: every weight (``full``,
600 steps at 1e-3) and LoRA of rank 4 with the digits' new embedding rows (``lora``, 600 steps at
5e-3; merged into the weights after training). Every model, the base included, is measured as
trained, per-channel int8 and NF4 (the attention and feed-forward matrices: the quantiser's
default), each on the same items:

- the held-out text (Tiny Shakespeare from ``tl.data.mc_tasks.HELD_OUT_START``,
  91 % of its characters, on: no shipped model trained on it): loss, perplexity, bits per byte;
- the two multiple-choice tasks of :mod:`transformer_lib.data.mc_tasks`, 200 items each, from
  the same held-out text;
- exact match on chapter "Fine-tuning"'s 200 held-out dates, greedy, and pass@1 and pass@8 from 16
  answers sampled at temperature 0.3 for the first 100 of them.
"""

from __future__ import annotations

import copy
import os
import tempfile
import time
from pathlib import Path

import transformer_lib as tl

from ..chapters import data_folder
from . import fine_tuning
from .fine_tuning_diagnosis import DIAGNOSIS, diagnosed_run
from .recorder import Experiment, Part

__all__ = ["EXPERIMENT"]

SEEDS = [0, 1, 2]
LM_EVAL_ITEMS = 40
#: where the held-out text starts (a fraction of the characters): after every shipped model's training split
START = tl.data.mc_tasks.HELD_OUT_START
#: the shipped models lm-eval scores: chapter "Fine-tuning"'s BPE base and chapter "What attention learns"'s character
# model
SHIPPED = {"bpe": tl.PRETRAINED_PATH, "char": data_folder("what_attention_learns") / "shakespeare_ckpt.pt"}
SETTINGS = {
    "mc_items": 200,
    "exact_pairs": 200,
    "sampled_pairs": 100,
    "samples": 16,
    "k": 8,
    "temperature": 0.3,
    "methods": ["full", "lora"],
    "quantised": ["int8", "nf4"],
    "held_out_start": START,
}


def measured(model, tokenizer, text: str, tasks: dict, test_pairs: list) -> dict:
    """The card of ``model``: text, tasks and exact match on every pair, then pass@k on the first
    ``sampled_pairs`` (the per-item and per-window lists are dropped, the intervals kept)."""
    card = tl.report_card(model, tokenizer, text=text, tasks=tasks, pairs=test_pairs[: SETTINGS["exact_pairs"]])
    sampled = tl.report_card(
        model, tokenizer, pairs=test_pairs[: SETTINGS["sampled_pairs"]], samples=SETTINGS["samples"],
        temperature=SETTINGS["temperature"], k=SETTINGS["k"],
    )  # fmt: skip
    card["exact"].update({k: v for k, v in sampled["exact"].items() if k.startswith("pass@")})
    card["exact"].update(samples=SETTINGS["samples"], temperature=SETTINGS["temperature"])
    card["exact"]["sampled_pairs"] = SETTINGS["sampled_pairs"]
    card.pop("items")
    card["text"].pop("windows")
    return card


def cards_of(model, tokenizer, text: str, tasks: dict, test_pairs: list) -> dict:
    """The cards of ``model`` as it is and quantised each way, with the bytes each takes."""
    out = {"float32": measured(model, tokenizer, text, tasks, test_pairs)}
    out["float32"]["bytes"] = tl.weight_bytes(model)
    for method in SETTINGS["quantised"]:
        small, report = tl.quantize_weights(model, method)
        out[method] = measured(small, tokenizer, text, tasks, test_pairs)
        out[method].update(bytes=report["bytes_after"], bits_per_weight=report["bits_per_weight"])
    return out


def tuned(method: str, model, tokenizer, train_pairs, test_pairs, seed: int, steps: int | None):
    """Chapter "Fine-tuning"'s fine-tune of the dates by ``method``, its adapters and rows merged."""
    how = dict(DIAGNOSIS)["full" if method == "full" else "lora + new rows at 5e-3"]
    r = diagnosed_run(model, tokenizer, train_pairs, test_pairs, how, seed,
                      steps or fine_tuning.SETTINGS["instruction_steps"], fine_tuning.SETTINGS)  # fmt: skip
    out = r.pop("model")
    if method == "lora":
        tl.remove_lora(out, merge=True)
        tl.remove_token_rows(out, merge=True)
    return out.eval(), r


def cards(seeds: list[int], steps: int | None = None) -> dict:
    model, tokenizer = fine_tuning.base()
    model.eval()
    text = fine_tuning.text()
    held = tl.data.held_out_text(text, START)
    tasks = {"speaker": tl.data.speaker_choice_task(text, SETTINGS["mc_items"], start_fraction=START),
             "cloze": tl.data.cloze_task(text, SETTINGS["mc_items"], start_fraction=START)}  # fmt: skip
    train_pairs, test_pairs = fine_tuning.date_splits()
    part = {"settings": SETTINGS, "base": cards_of(model, tokenizer, held, tasks, test_pairs), "runs": []}
    for method in SETTINGS["methods"]:
        for seed in seeds:
            start = time.perf_counter()
            fine, r = tuned(method, copy.deepcopy(model), tokenizer, train_pairs, test_pairs, seed, steps)
            row = {"method": method, "seed": seed, "steps": steps or fine_tuning.SETTINGS["instruction_steps"],
                   "cards": cards_of(fine, tokenizer, held, tasks, test_pairs),
                   "seconds": time.perf_counter() - start}  # fmt: skip
            print({"method": method, "seed": seed, "exact": row["cards"]["float32"]["exact"]}, flush=True)
            part["runs"].append(row)
    return {"cards": part}


def lm_eval_scores(seeds: list[int], steps: int | None = None) -> dict:
    """lm-eval's scores of the shipped models on the tasks' first items (``seeds`` and ``steps``
    are unused: nothing is trained or drawn at random)."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    text = fine_tuning.text()
    tasks = {"book_speaker": tl.data.speaker_choice_task(text, LM_EVAL_ITEMS, start_fraction=START),
             "book_cloze": tl.data.cloze_task(text, LM_EVAL_ITEMS, start_fraction=START)}  # fmt: skip
    part = {"items": LM_EVAL_ITEMS, "lm_eval_version": lm_eval.__version__, "models": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for name, items in tasks.items():
            tl.data.write_lm_eval_task(items, Path(tmp) / "tasks", name)
        for model_name, path in SHIPPED.items():
            tl.export_hf(path, Path(tmp) / model_name)
            # a character tokenizer has no start or end token: lm-eval is given an id to decode
            prefix = ",prefix_token_id=0" if model_name == "char" else ""
            out = lm_eval.simple_evaluate(
                model="hf", model_args=f"pretrained={Path(tmp) / model_name},dtype=float64{prefix}",
                tasks=list(tasks), task_manager=TaskManager(include_path=str(Path(tmp) / "tasks")),
                log_samples=True, device="cpu", batch_size=8,
            )  # fmt: skip
            part["models"][model_name] = {
                task: {
                    "acc": out["results"][task]["acc,none"],
                    "acc_norm": out["results"][task]["acc_norm,none"],
                    "loglikelihoods": [
                        [r[0] for r in s["filtered_resps"]]
                        for s in sorted(out["samples"][task], key=lambda s: s["doc_id"])
                    ],
                }
                for task in tasks
            }
    return {"lm_eval": part}


EXPERIMENT = Experiment("measuring_a_model", {"lm_eval": Part(lm_eval_scores, [0]), "cards": Part(cards, SEEDS)})
