"""Measuring a model (chapter "Measuring a model"): one quantity in three units, multiple
choice scored by log-likelihood as the standard harness scores it, pass@k, an interval on every
score, a judge's position bias, and the report card that puts them together.

- **Units.** A loss in nats per token, its perplexity ``exp(loss)``, and bits per byte
  (:func:`loss_units`): only the last compares models whose tokenizers differ.
- **Multiple choice** (:func:`score_multiple_choice`). Each choice is a continuation of the
  context; its score is the summed log-probability of its tokens (:func:`choice_loglikelihoods`).
  ``acc`` picks the largest sum, ``acc_norm`` the largest sum per character of the choice, as
  ``lm-eval`` does (the context's trailing spaces move to the continuation, the pair is encoded
  whole and the context's tokens cut off, ties go to the first choice).
- **Sampled answers** (:func:`pass_at_k`): the unbiased estimator of the chance that at least
  one of ``k`` answers is right, from ``n >= k`` samples of which ``c`` were right.
- **Intervals** over items (:func:`mean_interval`; Wilson's for a share,
  :func:`~transformer_lib.finetune.wilson_interval`), over windows of text
  (:func:`bootstrap_interval`) and for a difference on the same items
  (:func:`paired_difference`, with the items it would take to tell two models apart).
- **A judge** (:func:`position_bias`) is asked twice, the right answer first and then second:
  where the truth is known, any preference for a place is measured.

:func:`report_card` runs what applies to a model and its tokenizer; :func:`format_cards` prints
cards as a table to paste, side by side, with the difference and whether it is told apart.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch import nn
from torch.nn.utils import parametrize

from ._checks import check_int, is_real
from .chapters import data_folder
from .data.instructions import encode_pair
from .data.mc_tasks import MCItem
from .data.tokenizer import tokenizer_checksum
from .finetune import wilson_interval
from .tokens import bits_per_byte

__all__ = [
    "DATES_ADAPTER_PATH",
    "bootstrap_interval",
    "choice_loglikelihoods",
    "format_cards",
    "items_needed",
    "loss_units",
    "mean_interval",
    "paired_difference",
    "pass_at_k",
    "position_bias",
    "report_card",
    "sample_answers",
    "score_multiple_choice",
]

Z95 = 1.959963984540054  # the normal quantile of a two-sided 95 % interval
#: Chapter "Measuring a model"'s model that is sometimes right: LoRA adapters (rank 4, with the digits' new rows) of
#: chapter "Fine-tuning"'s shipped base, fine-tuned on the dates for 350 steps only; how, in ``dates_lora.json``.
DATES_ADAPTER_PATH = data_folder("measuring_a_model") / "dates_lora.pt"


# Units ----------------------------------------------------------------------------------------


def loss_units(nats_per_token: float, bytes_per_token: float | None = None) -> dict:
    """One loss in three units (chapter "Measuring a model"): ``loss`` (nats per token), ``perplexity`` (``e`` to
    the loss: the number of equally likely tokens the model hesitates between) and, given the
    text's bytes per token, ``bits_per_byte`` (the loss in bits, shared over the bytes)."""
    if not (is_real(nats_per_token) and math.isfinite(nats_per_token) and nats_per_token >= 0):
        raise ValueError(f"nats_per_token must be a finite number >= 0, got {nats_per_token!r}")
    nats_per_token = float(nats_per_token)  # a NumPy number, as Python's
    out = {"loss": nats_per_token, "perplexity": math.exp(nats_per_token)}
    if bytes_per_token is not None:
        if not (is_real(bytes_per_token) and math.isfinite(bytes_per_token) and bytes_per_token > 0):
            raise ValueError(f"bytes_per_token must be a number > 0, got {bytes_per_token!r}")
        out["bits_per_byte"] = nats_per_token / math.log(2) / float(bytes_per_token)
    return out


# Intervals ------------------------------------------------------------------------------------


def _scores(values, name: str) -> np.ndarray:
    a = np.asarray(values, dtype=np.float64)
    if a.ndim != 1 or len(a) < 2:
        raise ValueError(f"{name} must be a list of at least 2 numbers, got shape {a.shape}")
    if not np.isfinite(a).all():
        raise ValueError(f"{name} holds {a[~np.isfinite(a)][0]}: every score must be finite")
    return a


def mean_interval(values: Sequence[float], z: float = Z95) -> tuple[float, float, float]:
    """``(mean, low, high)`` of per-item scores (chapter "Measuring a model"): the mean plus and minus ``z`` standard
    errors (``sd / sqrt(n)``, the sample's sd), 95 % for the default ``z``."""
    a = _scores(values, "values")
    half = z * a.std(ddof=1) / math.sqrt(len(a))
    return float(a.mean()), float(a.mean() - half), float(a.mean() + half)


def bootstrap_interval(
    values: Sequence[float], weights: Sequence[float] | None = None, *, resamples: int = 2000, seed: int = 0
) -> tuple[float, float, float]:
    """``(estimate, low, high)`` of ``sum(values) / sum(weights)`` (the mean with no weights), and
    the 2.5 and 97.5 percentiles of it over ``resamples`` draws of the items with replacement
    (chapter "Measuring a model"): bits per byte over windows of text is ``values`` = bits, ``weights`` = bytes."""
    a = _scores(values, "values")
    w = np.ones_like(a) if weights is None else _scores(weights, "weights")
    if len(w) != len(a) or (w <= 0).any():
        raise ValueError(f"weights must be {len(a)} numbers > 0, one per value, got {len(w)}")
    check_int(resamples, "resamples")
    pick = np.random.default_rng(seed).integers(0, len(a), size=(resamples, len(a)))
    ratios = a[pick].sum(1) / w[pick].sum(1)
    low, high = np.percentile(ratios, [2.5, 97.5])
    return float(a.sum() / w.sum()), float(low), float(high)


def items_needed(sd: float, difference: float, z: float = Z95) -> int | None:
    """How many items make an interval of ``+- z sd / sqrt(n)`` narrower than ``difference``
    (chapter "Measuring a model"): ``ceil((z sd / difference) ** 2)``; None for a difference of 0 (no number does).
    A spread, difference or ``z`` that is not a finite number (a NaN from one item) raises a
    ``ValueError`` naming it."""
    for name, value in (("sd", sd), ("difference", difference), ("z", z)):
        if not (is_real(value) and math.isfinite(value)) or (name != "difference" and value < 0):
            rule = "a finite number" if name == "difference" else "a finite number >= 0"
            raise ValueError(f"{name} must be {rule}, got {value!r}")
    if difference == 0:
        return None
    return max(2, math.ceil((z * sd / abs(difference)) ** 2))


def paired_difference(a: Sequence[float], b: Sequence[float], z: float = Z95) -> dict:
    """Model A's per-item scores minus model B's on the same items (chapter "Measuring a model"): ``difference``
    (mean), its interval ``low``/``high``, ``apart`` (the interval leaves out 0) and
    ``items_needed`` to tell them apart at this difference and spread."""
    a, b = _scores(a, "a"), _scores(b, "b")
    if len(a) != len(b):
        raise ValueError(f"a and b must score the same items, got {len(a)} and {len(b)} scores")
    d = a - b
    mean, low, high = (float(d.mean()),) * 3 if not d.any() else mean_interval(d, z)
    sd = float(d.std(ddof=1))
    return {"difference": mean, "low": low, "high": high, "apart": low > 0 or high < 0,
            "items_needed": items_needed(sd, mean, z) if sd > 0 else None}  # fmt: skip


# Sampled answers ------------------------------------------------------------------------------


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased estimate of pass@k (chapter "Measuring a model") from ``n`` sampled answers of which ``c`` are
    right (Chen et al. 2021): ``1 - C(n - c, k) / C(n, k)``, the chance that ``k`` answers drawn from
    the ``n`` without replacement hold a right one, as a stable product."""
    check_int(n, "n")
    check_int(c, "c", minimum=0)
    check_int(k, "k")
    if c > n or k > n:
        raise ValueError(f"need c <= n and k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - float(np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


@torch.no_grad()
def sample_answers(
    model: nn.Module, tokenizer, prompts: Sequence[str], n: int, *, temperature: float = 1.0,
    max_new_tokens: int = 16, seed: int = 0,
) -> list[list[str]]:  # fmt: skip
    """``n`` answers of a fine-tuned ``model`` to each prompt (chapter "Measuring a model"), sampled at
    ``temperature`` from the prompt in its fine-tuning layout (``prompt + PROMPT_END``), each cut
    at the end token. The prompts of one length in ids are run as one batch of ``n`` rows each, in
    the order of their first prompt, from one generator seeded with ``seed``: the answers are
    repeatable, and at a temperature near 0 they are the greedy ones, whatever the batching."""
    check_int(n, "n")
    eos = tokenizer.eos_id
    g = torch.Generator().manual_seed(seed)
    encoded = [encode_pair(tokenizer, prompt, "", end=False) for prompt in prompts]
    by_length: dict[int, list[int]] = {}
    for i, (_, n_prompt) in enumerate(encoded):
        by_length.setdefault(n_prompt, []).append(i)
    out: list = [None] * len(prompts)
    for n_prompt, group in by_length.items():
        idx = torch.tensor([encoded[i][0][:n_prompt] for i in group for _ in range(n)], dtype=torch.long)  # (B, T)
        new = model.generate(idx, max_new_tokens, temperature=temperature, generator=g)[:, n_prompt:].tolist()
        for j, i in enumerate(group):
            rows = new[j * n : (j + 1) * n]
            out[i] = [tokenizer.decode(row[: row.index(eos)] if eos in row else row) for row in rows]
    return out


# Multiple choice ------------------------------------------------------------------------------


def _encode_choice(tokenizer, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """lm-eval's split of ``context + continuation`` into ids: trailing spaces of the context move
    to the continuation, the whole is encoded, and the context's own ids are cut off its front."""
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces:
        context, continuation = context[:-n_spaces], context[-n_spaces:] + continuation
    whole = tokenizer.encode(context + continuation)
    head = tokenizer.encode(context)
    return head, whole[len(head) :]


def _choice_request(tokenizer, context: str, continuation: str, T: int) -> tuple[list[int], int]:
    """The ids of one ``loglikelihood`` request, cropped on the left to ``T + 1``, and how many of
    the last ones are the continuation's; a continuation with no ids, or more than ``T``, refused."""
    head, tail = _encode_choice(tokenizer, context, continuation)
    if not tail:
        raise ValueError(f"the continuation {continuation!r} adds no token to the context {context[-30:]!r}")
    if len(tail) > T:
        raise ValueError(f"the continuation {continuation[:30]!r} has {len(tail)} tokens, more than context_len={T}")
    return (head + tail)[-(T + 1) :], len(tail)


@torch.no_grad()
def _loglikelihoods(model: nn.Module, requests: Sequence[tuple[list[int], int]], batch_size: int = 64) -> list[float]:
    """The summed log-probability (float64) of the last ``n`` ids of each ``(ids, n)`` request, given
    the ids before them. Requests are run longest first, ``batch_size`` rows at a time, each row
    right-padded to its batch's longest (a causal model's earlier positions never read the padding)."""
    order = sorted(range(len(requests)), key=lambda i: -len(requests[i][0]))
    out = [0.0] * len(requests)
    was = model.training
    model.eval()
    for first in range(0, len(order), batch_size):
        batch = order[first : first + batch_size]
        width = max(len(requests[i][0]) for i in batch) - 1
        rows = torch.zeros(len(batch), width, dtype=torch.long)  # (B, T)
        for row, i in enumerate(batch):
            ids = requests[i][0]
            rows[row, : len(ids) - 1] = torch.tensor(ids[:-1])
        logits, _ = model(rows)  # (B, T, vocab_size)
        logp = torch.log_softmax(logits.double(), dim=-1)
        for row, i in enumerate(batch):
            ids, n = requests[i]
            start = len(ids) - 1 - n  # the position that predicts the continuation's first id
            target = torch.tensor(ids[-n:])[:, None]  # (n, 1)
            out[i] = float(logp[row, start : start + n].gather(-1, target).sum())
    model.train(was)
    return out


def choice_loglikelihoods(model: nn.Module, tokenizer, context: str, continuations: Sequence[str]) -> list[float]:
    """The summed log-probability of each continuation's ids after ``context`` (chapter "Measuring a model"), in
    float64, as ``lm-eval``'s ``loglikelihood`` requests compute it: the pair is cut into ids by
    :func:`_encode_choice` and the last ``context_len + 1`` ids are kept (the context cropped on
    the left). The continuations are scored in one batch. No continuation at all, one string in
    place of a list, or a continuation with no ids of its own is refused."""
    if isinstance(continuations, str) or not continuations:
        raise ValueError(f"continuations must be a list of one or more strings, got {continuations!r}")
    T = model.config.context_len
    return _loglikelihoods(model, [_choice_request(tokenizer, context, c, T) for c in continuations])


def _item_loglikelihoods(model: nn.Module, tokenizer, items: Sequence[MCItem], delimiter: str) -> list[list[float]]:
    """:func:`choice_loglikelihoods` of every item's choices (each after ``delimiter``), the choices
    of all items run together in batches of rows rather than an item at a time."""
    T = model.config.context_len
    requests = [_choice_request(tokenizer, it.context, delimiter + c, T) for it in items for c in it.choices]
    flat, out = _loglikelihoods(model, requests), []
    for it in items:
        out.append(flat[: len(it.choices)])
        flat = flat[len(it.choices) :]
    return out


def score_multiple_choice(model: nn.Module, tokenizer, items: Sequence[MCItem], delimiter: str = " ") -> dict:
    """Score ``items`` by log-likelihood (chapter "Measuring a model"): ``acc`` (the choice with the largest summed
    log-probability is the answer) and ``acc_norm`` (the largest per character of the choice), each
    with a Wilson interval (``*_interval``); per item ``correct`` and ``correct_norm`` (1 or 0) and
    ``loglikelihoods``. Each choice is scored as ``delimiter + choice``; ties go to the first."""
    if not items:
        raise ValueError("items is empty: give at least one MCItem")
    lls, right, right_norm = [], [], []
    for item, scores in zip(items, _item_loglikelihoods(model, tokenizer, items, delimiter), strict=True):
        ll = np.array(scores)
        lengths = np.array([float(len(c)) for c in item.choices])
        lls.append(ll.tolist())
        right.append(int(np.argmax(ll) == item.answer))
        right_norm.append(int(np.argmax(ll / lengths) == item.answer))
    n = len(items)
    return {"n": n, "acc": sum(right) / n, "acc_norm": sum(right_norm) / n,
            "acc_interval": wilson_interval(sum(right), n), "acc_norm_interval": wilson_interval(sum(right_norm), n),
            "correct": right, "correct_norm": right_norm, "loglikelihoods": lls}  # fmt: skip


# A judge --------------------------------------------------------------------------------------


def position_bias(judge: Callable[[str, str, str], int], cases: Sequence[tuple[str, str, str]]) -> dict:
    """Ask ``judge(question, first, second)`` (0: the first answer is better, 1: the second) about
    each ``(question, right, wrong)`` case twice (chapter "Measuring a model"), the right answer first and then
    second. Returns ``right_when_first``, ``right_when_second`` (accuracies), ``picks_first`` (the share
    of all verdicts that chose the first place: 0.5 for a judge with no preference) and
    ``consistent`` (the share of cases judged the same both ways)."""
    if not cases:
        raise ValueError("cases is empty: give at least one (question, right, wrong)")
    first, second = [], []
    for question, right, wrong in cases:
        for verdicts, pair, want in ((first, (right, wrong), 0), (second, (wrong, right), 1)):
            v = judge(question, *pair)
            if v not in (0, 1):
                raise ValueError(f"the judge must return 0 (first) or 1 (second), got {v!r}")
            verdicts.append(int(v == want))
    n = len(cases)
    picks_first = (sum(first) + (n - sum(second))) / (2 * n)
    same = sum(a == b for a, b in zip(first, second, strict=True))
    return {"n": n, "right_when_first": sum(first) / n, "right_when_second": sum(second) / n,
            "picks_first": picks_first, "consistent": same / n}  # fmt: skip


# The report card ------------------------------------------------------------------------------


def _text_units(model: nn.Module, tokenizer, text: str) -> dict:
    """Loss, perplexity and bits per byte on ``text``, with a bootstrap interval over its windows."""
    ids = torch.tensor(tokenizer.encode(text))
    if len(ids) < 2 * model.config.context_len + 2:
        raise ValueError(
            f"the text is {len(ids)} tokens long, too short for an interval over windows: give at least "
            f"{2 * model.config.context_len + 2} tokens (two windows of context_len + 1)"
        )
    r = bits_per_byte(model, ids, tokenizer, windows=True)
    nats, counts, nbytes = (np.array(c, dtype=np.float64) for c in zip(*r["windows"], strict=True))
    units = loss_units(r["nats_per_token"], r["bytes"] / r["tokens"])
    _, low, high = bootstrap_interval(nats / math.log(2), nbytes)
    return {**units, "bits_per_byte_interval": (low, high), "tokens": r["tokens"], "bytes": r["bytes"],
            "windows": [list(w) for w in r["windows"]]}  # fmt: skip


def report_card(
    model: nn.Module, tokenizer, *, text: str | None = None, tasks: dict[str, Sequence[MCItem]] | None = None,
    pairs: Sequence[tuple[str, str]] | None = None, samples: int = 0, temperature: float = 1.0, k: int = 1,
    max_new_tokens: int = 16, seed: int = 0,
) -> dict:  # fmt: skip
    """The report card of ``model`` (chapter "Measuring a model"), each part where its input is given:

    - ``text`` (held-out text): ``loss``, ``perplexity``, ``bits_per_byte`` and its interval;
    - ``tasks`` (name -> multiple-choice items): ``acc`` and ``acc_norm`` of each, with intervals;
    - ``pairs`` (prompt, response) of an instruction task: ``exact_match`` of the greedy answer
      (with the end token) and its interval; with ``samples`` (n per prompt, at ``temperature``),
      ``pass@1`` and ``pass@k``, each a mean over the prompts of :func:`pass_at_k`.

    Per-item scores are kept under ``"items"`` so that two cards of the same items can be
    compared item by item (:func:`format_cards`). A LoRA model's weights (and new token rows) are
    computed once for the whole card, not at every forward."""
    with torch.no_grad(), parametrize.cached():
        return _card(model, tokenizer, text, tasks, pairs, samples, temperature, k, max_new_tokens, seed)


def _card(model, tokenizer, text, tasks, pairs, samples, temperature, k, max_new_tokens, seed) -> dict:
    """:func:`report_card`'s body, under one cache of the parametrized weights."""
    if samples and not pairs:
        raise ValueError(f"samples={samples} needs pairs to sample answers to: give pairs, or samples=0")
    card: dict = {"params": sum(p.numel() for p in model.parameters()), "items": {}}
    if hasattr(tokenizer, "to_dict"):  # a loss per token compares only within one tokenizer
        card["tokenizer"] = tokenizer_checksum(tokenizer)
    if text is not None:
        card["text"] = _text_units(model, tokenizer, text)
    for name, items in (tasks or {}).items():
        s = score_multiple_choice(model, tokenizer, items)
        card[name] = {key: s[key] for key in ("n", "acc", "acc_norm", "acc_interval", "acc_norm_interval")}
        card["items"][f"{name} acc"], card["items"][f"{name} acc_norm"] = s["correct"], s["correct_norm"]
    if pairs:
        from .finetune import answers  # greedy, batched by prompt length

        if getattr(tokenizer, "eos_id", None) is None:
            raise ValueError("exact match needs a tokenizer with an end token, so that an answer can stop: "
                             "a character run has none; score it with text and tasks")  # fmt: skip

        prompts = [encode_pair(tokenizer, p, r, end=False) for p, r in pairs]
        got = answers(model, tokenizer, [ids[:n] for ids, n in prompts], max_new_tokens)
        right = [int(stop and tokenizer.decode(ids) == r) for (ids, stop), (_, r) in zip(got, pairs, strict=True)]
        part = {"n": len(pairs), "exact_match": sum(right) / len(pairs),
                "exact_match_interval": wilson_interval(sum(right), len(pairs))}  # fmt: skip
        card["items"]["exact_match"] = right
        if samples:
            if k > samples:
                raise ValueError(f"k={k} needs at least k samples per prompt, got samples={samples}")
            drawn = sample_answers(model, tokenizer, [p for p, _ in pairs], samples, temperature=temperature,
                                   max_new_tokens=max_new_tokens, seed=seed)  # fmt: skip
            hits = [sum(a == r for a in row) for row, (_, r) in zip(drawn, pairs, strict=True)]
            for kk in sorted({1, k}):
                per = [pass_at_k(samples, c, kk) for c in hits]
                part[f"pass@{kk}"] = sum(per) / len(per)
                # over the prompts, drawn with replacement (one prompt: no spread to draw from)
                part[f"pass@{kk}_interval"] = bootstrap_interval(per, seed=seed)[1:] if len(per) > 1 else (0.0, 1.0)
                card["items"][f"pass@{kk}"] = per
            part.update(samples=samples, temperature=temperature)
        card["exact"] = part
    return card


_PER_TOKEN = ("loss (nats/token)", "perplexity")  # rows whose difference needs one tokenizer


def _rows(card: dict) -> list[tuple[str, str, float, tuple | None]]:
    """``(row name, items key, value, interval)`` for each number on a card, in the table's order."""
    rows = []
    if "text" in card:
        t = card["text"]
        rows += [("loss (nats/token)", "", t["loss"], None), ("perplexity", "", t["perplexity"], None),
                 ("bits per byte", "", t["bits_per_byte"], t["bits_per_byte_interval"])]  # fmt: skip
    for name, part in card.items():
        if isinstance(part, dict) and "acc" in part:
            rows += [(f"{name} acc", f"{name} acc", part["acc"], part["acc_interval"]),
                     (f"{name} acc_norm", f"{name} acc_norm", part["acc_norm"], part["acc_norm_interval"])]  # fmt: skip
    if "exact" in card:
        e = card["exact"]
        rows.append(("exact match", "exact_match", e["exact_match"], e["exact_match_interval"]))
        for key in sorted(k for k in e if k.startswith("pass@")):
            if not key.endswith("_interval"):
                rows.append(
                    (f"{key} (T={e['temperature']:g}, n={e['samples']})", key, e[key], e.get(key + "_interval"))
                )
    return rows


_LOWER_IS_BETTER = ("loss (nats/token)", "perplexity", "bits per byte")
_FROM_WINDOWS = {  # a row of the text's numbers from its windows' (nats, tokens, bytes) sums
    "loss (nats/token)": lambda nats, tokens, nbytes: nats / tokens,
    "perplexity": lambda nats, tokens, nbytes: np.exp(nats / tokens),
    "bits per byte": lambda nats, tokens, nbytes: nats / math.log(2) / nbytes,
}


def _window_difference(
    label: str, a: list, b: list, resamples: int = 2000, seed: int = 0
) -> tuple[float, float, float, str]:
    """``(difference, low, high, how)`` of a text row between two cards, from their windows: a
    paired bootstrap where both cut the text into the same windows (the same bytes in each), else
    the two drawn independently (two tokenizers: the windows differ, the text is the same)."""
    f = _FROM_WINDOWS[label]
    wa, wb = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)  # (windows, 3)
    rng = np.random.default_rng(seed)
    paired = wa.shape == wb.shape and np.array_equal(wa[:, 1:], wb[:, 1:])
    pick_a = rng.integers(0, len(wa), size=(resamples, len(wa)))
    pick_b = pick_a if paired else rng.integers(0, len(wb), size=(resamples, len(wb)))
    draws = f(*wa[pick_a].sum(1).T) - f(*wb[pick_b].sum(1).T)
    low, high = np.percentile(draws, [2.5, 97.5])
    return float(f(*wa.sum(0)) - f(*wb.sum(0))), float(low), float(high), "paired" if paired else "unpaired"


def format_cards(cards: dict[str, dict], digits: int = 3) -> str:
    """The cards (name -> :func:`report_card`) as one Markdown table, a column each (chapter "Measuring a model"). With
    two cards a last column gives the first minus the second, with its paired 95 % interval where
    both scored the same items, and "yes" where that interval leaves out 0 (told apart). The text's
    rows get a bootstrap over its windows, paired where both cut it into the same windows (else
    unpaired: bits per byte compares two tokenizers); a loss or perplexity per token of two
    different tokenizers gets no difference, with the reason. The "better" column says which way
    each row improves."""
    if not cards:
        raise ValueError("give at least one card")
    names = list(cards)
    tables = {name: {r[0]: r for r in _rows(card)} for name, card in cards.items()}
    order = list(dict.fromkeys(r for t in tables.values() for r in t))
    head = ["", "better", *names] + (["difference", "told apart"] if len(names) == 2 else [])
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]

    def cell(row):
        _, _, value, interval = row
        s = f"{value:.{digits}f}"
        return s + (f" [{interval[0]:.{digits}f}, {interval[1]:.{digits}f}]" if interval else "")

    for label in order:
        got = [tables[n].get(label) for n in names]
        line = [label, "lower" if label in _LOWER_IS_BETTER else "higher"] + [cell(r) if r else "" for r in got]
        if len(names) == 2 and all(got):
            key = got[0][1]
            a, b = (cards[n]["items"].get(key) for n in names)
            if a is not None and b is not None and len(a) == len(b) and len(a) >= 2:
                d = paired_difference(a, b)
                line += [f"{d['difference']:+.{digits}f} [{d['low']:+.{digits}f}, {d['high']:+.{digits}f}]",
                         "yes" if d["apart"] else "no"]  # fmt: skip
            elif label in _PER_TOKEN and cards[names[0]].get("tokenizer") != cards[names[1]].get("tokenizer"):
                line += ["none: a token of one tokenizer is not one of the other (compare bits per byte)", ""]
            elif label in _FROM_WINDOWS and all("windows" in cards[n].get("text", {}) for n in names):
                diff, low, high, how = _window_difference(label, *(cards[n]["text"]["windows"] for n in names))
                line += [f"{diff:+.{digits}f} [{low:+.{digits}f}, {high:+.{digits}f}] {how}",
                         "yes" if low > 0 or high < 0 else "no"]  # fmt: skip
            else:
                line += [f"{got[0][2] - got[1][2]:+.{digits}f} (no interval: the cards hold no per-item scores)", ""]
        lines.append("| " + " | ".join(line) + " |")
    return "\n".join(lines)
