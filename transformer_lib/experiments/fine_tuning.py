"""The fine-tuning runs over seeds of chapter "Fine-tuning": the chapter reads the record,
``transformer_lib/data/ch15/finetune_sweep.json`` (``recorded("fine_tuning")``), and re-runs seed 0 of
some of them live.

Everything starts from the shipped pretrained GPT (``transformer_lib/data/ch15/pretrained.pt``,
made by ``scripts/pretrain_ch15.py`` on the first 90 % of Tiny Shakespeare):

- ``classification``: two tasks from the last 10 % (who speaks, among five speakers; is the word
  order real), each trained four ways (the head only, LoRA and the head, every weight, and a new
  model of the same shape from scratch), five seeds each; the majority class and a character
  n-gram logistic regression beside them; the language model's validation loss after each run;
- ``contamination``: the pretrained model trained further (three seeds) on the last 10 % (the text
  that holds the test speeches) or, as the control, on as much text from the first 90 %; then
  its loss on the test texts, a zero-shot word-order test that reads only that loss, and the
  same classifier (the head alone) on each;
- ``instructions``: the dates of chapter "Encoder-decoder and cross-attention" as prompt/response
  pairs, fine-tuned the right way and with each of three mistakes, three seeds each; exact match,
  answers that stop, and the language model's validation loss after.

The command line (``--dry-run`` prints and writes nothing)::

    # everything (about 20 minutes on one core)
    python -m transformer_lib.experiments fine_tuning
    # print only
    python -m transformer_lib.experiments fine_tuning --parts diagnosis --dry-run
"""

from __future__ import annotations

import sys
import time

import numpy as np
import torch

import transformer_lib as tl

from . import fine_tuning_diagnosis
from .recorder import Experiment, Part

__all__ = ["EXPERIMENT"]

PRETRAINED = tl.PRETRAINED_PATH
SEEDS = [0, 1, 2, 3, 4]
THREE_SEEDS = [0, 1, 2]
DTYPE_NAME = "float32"  # one core; the chapter prints these results, read from here, not recomputed
DTYPE = getattr(torch, DTYPE_NAME)
METHODS = ["head", "lora", "full", "scratch"]
#: the settings of every run, recorded with the results
SETTINGS = {
    "classifier_steps": 150,
    "classifier_batch": 16,
    "lora_rank": 4,
    "dtype": DTYPE_NAME,
    "contamination_steps": 500,
    "contamination_method": "head",
    "instruction_steps": 600,
    "instruction_batch": 16,
    "instruction_lr": 1e-3,
    "date_formats": ["dd.mm.yyyy", "yyyy.mm.dd", "mm/dd/yyyy"],
    "n_train_pairs": 2000,
    "n_test_pairs": 200,
    "max_new_tokens": 16,
}


def text() -> str:
    return tl.data.SHIPPED_PATH.read_text(encoding="utf-8")


def tasks() -> dict:
    t = text()
    return {"speaker": tl.speaker_task(t), "word_order": tl.word_order_task(t)}


def val_tokens(tokenizer) -> torch.Tensor:
    t = text()
    return torch.tensor(tokenizer.encode(t[int(len(t) * 0.9) :]))


def base() -> tuple:
    model, tokenizer, _ = tl.load_checkpoint(PRETRAINED)
    return model.to(DTYPE), tokenizer


def baselines(task) -> dict:
    """The majority class of the training split, and a logistic regression on character n-grams."""
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression

    x, y = task.split("train")
    xt, yt = task.split("test")
    majority = max(set(y), key=y.count)
    vectorizer = TfidfVectorizer(analyzer="char", ngram_range=(1, 5), sublinear_tf=True, min_df=2)
    clf = LogisticRegression(max_iter=5000, C=10.0).fit(vectorizer.fit_transform(x), y)
    predicted = clf.predict(vectorizer.transform(xt))
    n = len(yt)
    return {
        "majority": {"correct": sum(v == majority for v in yt), "n": n},
        "ngram": {"correct": int((predicted == np.array(yt)).sum()), "n": n},
    }


def classify(model, tokenizer, task, method: str, seed: int, steps: int | None = None) -> dict:
    """``tl.classifier_run`` with the recorded settings (``steps``: a smoke run's)."""
    return tl.classifier_run(
        model,
        tokenizer,
        task,
        method,
        seed,
        steps=steps or SETTINGS["classifier_steps"],
        batch_size=SETTINGS["classifier_batch"],
        rank=SETTINGS["lora_rank"],
        dtype=DTYPE,
    )


def classification(seeds: list[int], steps: int | None = None) -> dict:
    model, tokenizer = base()
    before = tl.window_loss(model, val_tokens(tokenizer))
    out = {"val_loss_before": before}
    for name, task in tasks().items():
        rows = []
        for method in METHODS:
            for seed in seeds:
                r = classify(model, tokenizer, task, method, seed, steps)
                after = tl.window_loss(r["model"].gpt, val_tokens(tokenizer)) if method != "scratch" else None
                rows.append(
                    {
                        "method": method,
                        "seed": seed,
                        "val_loss_after": after,
                        **{k: r[k] for k in ("accuracy", "correct", "n", "trainable", "seconds")},
                    }
                )
                print(name, rows[-1], flush=True)
        out[name] = {
            "classes": task.classes,
            "n_train": len(task.train),
            "n_test": len(task.test),
            "runs": rows,
            **baselines(task),
        }
    return {"settings": SETTINGS, "classification": out}


def further_pretraining(model, tokens: torch.Tensor, seed: int, steps: int) -> tl.GPT:
    """A copy of ``model`` trained ``steps`` more steps on windows of ``tokens``."""
    import copy

    model = copy.deepcopy(model).train()
    T = model.config.context_len
    n = int(len(tokens) * 0.95)
    batches = tl.LMBatches(tokens[:n], tokens[n:], T, 12, seed=seed)
    config = tl.TrainConfig(
        max_iters=steps,
        lr=3e-4,
        min_lr=3e-5,
        warmup_iters=20,
        eval_interval=0,
        device="cpu",
        progress=False,
        verbose=False,
    )
    tl.train(model, batches, config)
    return model.eval()


def text_losses(model, tokenizer, texts) -> list[float]:
    """Each text's mean next-token loss over its first ``context_len + 1`` tokens."""
    T = model.config.context_len
    out = []
    with torch.no_grad():
        for t in texts:
            ids = torch.tensor([tokenizer.encode(t)[: T + 1]])
            out.append(model(ids[:, :-1], ids[:, 1:])[1].item())
    return out


def zero_shot_word_order(model, tokenizer, task) -> dict:
    """Real or shuffled without training: a text is called real when the language model's loss on
    it is below a threshold, the one that does best on the training split."""
    x, y = task.split("train")
    xt, yt = task.split("test")
    train_loss, test_loss = text_losses(model, tokenizer, x), text_losses(model, tokenizer, xt)
    best = max(
        sorted(train_loss), key=lambda c: sum((v <= c) == (label == 1) for v, label in zip(train_loss, y, strict=True))
    )
    correct = sum((v <= best) == (label == 1) for v, label in zip(test_loss, yt, strict=True))
    return {"correct": correct, "n": len(yt), "accuracy": correct / len(yt)}


def contamination(seeds: list[int], steps: int | None = None) -> dict:
    model, tokenizer = base()
    t = text()
    cut = int(len(t) * 0.9)
    seen = torch.tensor(tokenizer.encode(t[cut:]))  # holds every test speech, with its speaker's name
    control = torch.tensor(tokenizer.encode(t[cut - (len(t) - cut) : cut]))  # as much text, from the training split
    all_tasks = tasks()
    test_texts = [
        all_tasks["word_order"].texts[i] for i in all_tasks["word_order"].test if all_tasks["word_order"].labels[i] == 1
    ]
    out = {
        "pretrained": {
            "test_text_loss": sum(text_losses(model, tokenizer, test_texts)) / len(test_texts),
            "zero_shot": zero_shot_word_order(model, tokenizer, all_tasks["word_order"]),
        }
    }
    for kind, tokens in (("saw the test texts", seen), ("control", control)):
        out[kind] = {name: [] for name in all_tasks} | {"runs": []}
        for seed in seeds:
            further = further_pretraining(model, tokens, seed, steps or SETTINGS["contamination_steps"])
            run = {
                "seed": seed,
                "test_text_loss": sum(text_losses(further, tokenizer, test_texts)) / len(test_texts),
                "zero_shot": zero_shot_word_order(further, tokenizer, all_tasks["word_order"]),
            }
            out[kind]["runs"].append(run)
            print(kind, run, flush=True)
            for name, task in all_tasks.items():
                r = classify(further, tokenizer, task, SETTINGS["contamination_method"], seed, steps)
                out[kind][name].append({"seed": seed, "accuracy": r["accuracy"], "correct": r["correct"], "n": r["n"]})
                print(kind, name, out[kind][name][-1], flush=True)
    return {"settings": SETTINGS, "contamination": out}


def date_splits() -> tuple[list, list]:
    """Training and test pairs of the dates task, no date in both."""
    pairs = tl.date_pairs(
        SETTINGS["n_train_pairs"] + 2 * SETTINGS["n_test_pairs"], seed=0, formats=SETTINGS["date_formats"]
    )
    test = pairs[-SETTINGS["n_test_pairs"] :]
    held = {r for _, r in test}
    train = [p for p in pairs[: -SETTINGS["n_test_pairs"]] if p[1] not in held][: SETTINGS["n_train_pairs"]]
    return train, test


def instructions(seeds: list[int], steps: int | None = None) -> dict:
    model, tokenizer = base()
    train_pairs, test_pairs = date_splits()
    before = tl.window_loss(model, val_tokens(tokenizer))
    rows = []
    for method, rank in (("full", None), ("lora", SETTINGS["lora_rank"])):
        for variant in tl.INSTRUCTION_VARIANTS if method == "full" else ["right"]:
            for seed in seeds:
                start = time.perf_counter()
                r = tl.instruction_run(
                    model,
                    tokenizer,
                    train_pairs,
                    test_pairs,
                    variant,
                    seed,
                    steps=steps or SETTINGS["instruction_steps"],
                    batch_size=SETTINGS["instruction_batch"],
                    lr=SETTINGS["instruction_lr"],
                    lora_rank=rank,
                    max_new_tokens=SETTINGS["max_new_tokens"],
                    dtype=DTYPE,
                )
                rows.append(
                    {
                        "method": method,
                        "variant": variant,
                        "seed": seed,
                        "seconds": time.perf_counter() - start,
                        "val_loss_after": tl.window_loss(r["model"], val_tokens(tokenizer)),
                        **{k: r[k] for k in ("exact_match", "correct_start", "stopped", "answers")},
                    }
                )
                print(rows[-1], flush=True)
    part = {"val_loss_before": before, "n_train": len(train_pairs), "n_test": len(test_pairs), "runs": rows}
    return {"settings": SETTINGS, "instructions": part}


def diagnosis(seeds: list[int], steps: int | None = None) -> dict:
    """Why LoRA learned the dates' format and not the dates, and the fix
    (:mod:`transformer_lib.experiments.fine_tuning_diagnosis`)."""
    return fine_tuning_diagnosis.diagnosis(seeds, steps, sys.modules[__name__])


EXPERIMENT = Experiment(
    "fine_tuning",
    {
        "classification": Part(classification, SEEDS),
        "contamination": Part(contamination, THREE_SEEDS),
        "instructions": Part(instructions, THREE_SEEDS),
        "diagnosis": Part(diagnosis, THREE_SEEDS),  # ch15_diagnosis.py
    },
)
