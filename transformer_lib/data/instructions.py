"""Prompt/response data for instruction-style fine-tuning (chapter "Fine-tuning").

A pair is a prompt and the response a model should write after it. Each is laid out for a
decoder-only model as ``prompt, PROMPT_END, response, <|endoftext|>`` and trained on with the
loss on the response's tokens and the end token only: the prompt is given, not predicted, and
the padding that fills a row is no token at all. The files that the ``finetune`` command reads
hold one JSON object ``{"prompt": ..., "response": ...}`` a line (JSON Lines).
"""

from __future__ import annotations

import datetime
import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from .._checks import check_int
from .batches import _Batches
from .tasks import DATE_FIRST, DATE_FORMATS, DATE_LAST, render_date

__all__ = ["PROMPT_END", "InstructionBatches", "date_pairs", "encode_pair", "read_pairs", "write_pairs"]

#: What separates a prompt from its response: the model's cue that the answer starts.
PROMPT_END = "\n=> "


#: The end token the layout writes after every response: a prompt or response that spells it is refused.
END_TOKEN = "<|endoftext|>"


def _pair_problem(pair, specials: Sequence[str]) -> tuple[type[Exception], str] | None:
    """What is wrong with ``pair`` as a ``(prompt, response)`` of text, or None: the error's class and words."""
    if isinstance(pair, (str, bytes, dict)) or not isinstance(pair, Sequence):
        return TypeError, f"is a {type(pair).__name__}, not a (prompt, response) pair"
    if len(pair) != 2:
        return ValueError, f"has {len(pair)} items, not 2 (a prompt and a response)"
    for name, text in zip(("prompt", "response"), pair, strict=True):
        if not isinstance(text, str):
            return TypeError, f"has a {name} of type {type(text).__name__}, not text"
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            return ValueError, f"has a {name} holding {text[e.start]!r} at index {e.start}, a lone surrogate"
        if spelt := next((s for s in specials if s in text), None):
            return ValueError, f"has a {name} that spells the special token {spelt!r}, which the layout adds itself"
    if not pair[1]:
        return ValueError, "has an empty response"
    return None


def read_pairs(path: str | os.PathLike, *, specials: Sequence[str] = (END_TOKEN,)) -> list[tuple[str, str]]:
    """The ``(prompt, response)`` pairs of a JSON Lines file, one object ``{"prompt": str,
    "response": str}`` a line (blank lines are skipped) (chapter "Fine-tuning"). A line that is not such an object is a
    ``ValueError`` naming the file and the line's number, as is text that cannot be encoded: a lone
    surrogate (``"\\ud800"`` in JSON), or the spelling of one of ``specials`` (by default the end
    token; pass the tokenizer's ``specials`` to refuse all of its special tokens)."""
    path = Path(path)
    pairs = []
    with open(path, encoding="utf-8-sig") as f:
        for n, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}, line {n}: not JSON ({e.msg} at column {e.colno})") from None
            if not isinstance(obj, dict) or set(obj) != {"prompt", "response"}:
                keys = sorted(obj) if isinstance(obj, dict) else type(obj).__name__
                raise ValueError(f'{path}, line {n}: expected {{"prompt": ..., "response": ...}}, got {keys}')
            if not all(isinstance(obj[k], str) for k in obj) or not obj["response"]:
                raise ValueError(f"{path}, line {n}: the prompt and the response must be text, the response not empty")
            if problem := _pair_problem((obj["prompt"], obj["response"]), specials):
                raise ValueError(f"{path}, line {n}: the pair {problem[1]}")
            pairs.append((obj["prompt"], obj["response"]))
    if not pairs:
        raise ValueError(f"{path} holds no prompt/response pair")
    return pairs


def write_pairs(pairs: Iterable[tuple[str, str]], path: str | os.PathLike, *, force: bool = False) -> Path:
    """Write ``pairs`` to ``path`` as JSON Lines (the ``finetune`` command's input) (chapter "Fine-tuning"),
    atomically; an existing file that holds anything else is kept unless ``force``. Each pair must
    be a ``(prompt, response)`` of text that :func:`read_pairs` reads back (a dict, a triple, a
    number, an empty response, a lone surrogate or the end token's spelling is refused by its index)."""
    from ..utils import atomic_write

    path = Path(path)
    if isinstance(pairs, (str, bytes, dict)) or not isinstance(pairs, Iterable):
        raise TypeError(f"pairs must be a list of (prompt, response) pairs, got a {type(pairs).__name__}")
    pairs = list(pairs)
    for i, pair in enumerate(pairs):
        if problem := _pair_problem(pair, (END_TOKEN,)):
            raise problem[0](f"pairs[{i}] {problem[1]}: {str(pair)[:80]}")
    lines = "".join(json.dumps({"prompt": p, "response": r}, ensure_ascii=False) + "\n" for p, r in pairs)
    if path.exists() and not force and (not path.is_file() or path.read_text(encoding="utf-8") != lines):
        raise FileExistsError(f"{path} exists and holds something else: choose another path, or force=True")
    return atomic_write(path, lambda tmp: Path(tmp).write_text(lines, encoding="utf-8"))


def encode_pair(tokenizer, prompt: str, response: str, *, end: bool = True) -> tuple[list[int], int]:
    """``(ids, n_prompt)``: ``prompt + PROMPT_END`` then ``response`` as ids, with the tokenizer's
    end token after them (``end=True``); ``n_prompt`` counts the prompt's ids (chapter "Fine-tuning"). The two parts are
    encoded apart, so the response's first token never merges with the prompt's last. A part that
    the tokenizer refuses (it spells a special token, say) is a ``ValueError`` that says which."""
    if end and getattr(tokenizer, "eos_id", None) is None:
        raise ValueError("the tokenizer has no end token (<|endoftext|> or <eos>): train it with one")
    parts = []
    for name, text in (("prompt", prompt + PROMPT_END), ("response", response)):
        try:
            parts.append(tokenizer.encode(text))
        except ValueError as e:
            raise ValueError(f"the {name} {text[:40]!r}: {e}") from None
    head, body = parts
    ids = head + body + ([tokenizer.eos_id] if end else [])
    return ids, len(head)


def date_pairs(n: int, seed: int = 0, formats: Sequence[str] = DATE_FORMATS) -> list[tuple[str, str]]:
    """``n`` prompt/response pairs of chapter "Encoder-decoder and cross-attention"'s dates task: a date written in one
    of ``formats`` and the same date in ISO form, dates and formats drawn with ``seed``."""
    check_int(n, "n")
    rng = np.random.default_rng(seed)
    n_days = (DATE_LAST - DATE_FIRST).days + 1
    days, picks = rng.integers(0, n_days, n), rng.integers(0, len(formats), n)
    out = []
    for day, f in zip(days, picks, strict=True):
        date = DATE_FIRST + datetime.timedelta(days=int(day))
        out.append((render_date(date, formats[int(f)]), date.isoformat()))
    return out


class InstructionBatches(_Batches):
    """Batches of prompt/response rows for a decoder-only model (chapter "Fine-tuning").

    ``InstructionBatches(train, val, context_len, batch_size, pad_id)``, ``train`` and ``val``
    lists of ``(ids, n_prompt)`` from :func:`encode_pair`. ``batches(split)`` returns the keyword
    arguments of :class:`~transformer_lib.models.GPT`: ``{"idx": (B, T), "targets": (B, T),
    "loss_mask": (B, T)}``, rows padded on the right with ``pad_id``. The mask marks the targets
    that are the response's tokens and its end token. The two switches exist to show mistakes:
    ``mask_prompt=False`` counts the prompt's tokens too, ``mask_padding=False`` the padding.
    """

    def __init__(
        self,
        train: list,
        val: list,
        context_len: int,
        batch_size: int,
        pad_id: int,
        *,
        mask_prompt: bool = True,
        mask_padding: bool = True,
        **sampling,
    ):
        super().__init__(batch_size, **sampling)
        check_int(context_len, "context_len")
        check_int(pad_id, "pad_id", minimum=0)
        self.context_len, self.pad_id = context_len, pad_id
        self.mask_prompt, self.mask_padding = mask_prompt, mask_padding
        self.rows = {}
        for name, pairs in (("train", train), ("val", val)):
            if not pairs:
                raise ValueError(f"the {name} split holds no pair")
            longest = max(len(ids) for ids, _ in pairs)
            if longest > context_len + 1:
                raise ValueError(f"a {name} pair has {longest} tokens; the model reads {context_len} (+1 target)")
            self.rows[name] = self._tensors(pairs)

    def _tensors(self, pairs: list) -> tuple[Tensor, Tensor, Tensor]:
        T, n = self.context_len, len(pairs)
        x = torch.full((n, T), self.pad_id, dtype=torch.long)
        y = torch.full((n, T), self.pad_id, dtype=torch.long)
        mask = torch.zeros(n, T, dtype=torch.bool)
        for i, (ids, n_prompt) in enumerate(pairs):
            ids = torch.tensor(ids, dtype=torch.long)
            k = len(ids) - 1  # inputs ids[:-1] predict targets ids[1:]
            x[i, :k], y[i, :k] = ids[:-1], ids[1:]
            first = 0 if not self.mask_prompt else n_prompt - 1  # the target at k is ids[k + 1]
            mask[i, first:k] = True
            if not self.mask_padding:
                mask[i, k:] = True
        return x, y, mask

    def __call__(self, split: str = "train") -> dict[str, Tensor]:
        self._check_split(split)
        x, y, mask = self.rows[split]
        rows = self._rows(split, len(x))
        return {k: t[rows].to(self.device) for k, t in (("idx", x), ("targets", y), ("loss_mask", mask))}
