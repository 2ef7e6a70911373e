"""Induction heads (chapter "What attention learns"): a small attention-only transformer,
its heads' OV circuits, and the training run on repeated sequences whose history shows the
phase change in which induction heads form; and the chapter's other probes: the loss at each
position of the context, and the subject-verb agreement sentences of the grammar of chapter "A GPT from scratch".
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ._checks import check_bool, check_divisible, check_index, check_int, is_int, is_real
from .data.repeats import _distance_range, repeat_batch
from .encoder_decoder import _check_targets, _init_weights, check_token_ids
from .inspect_heads import _choose, eval_attention, induction_score, previous_token_score
from .multihead import MultiHeadAttention

__all__ = [
    "AttentionOnly",
    "agreement_probability",
    "agreement_prompts",
    "agreement_text",
    "head_scores",
    "loss_by_position",
    "ov_circuit",
    "phase_change_step",
    "train_on_repeats",
]


class AttentionOnly(nn.Module):
    """A transformer with attention layers only, no feed-forward networks (chapter "What attention learns").

    ``AttentionOnly(vocab_size, context_len, n_layers=2, n_heads=4, d_model=64, *,
    layer_norm=True, bias=True)``: token embeddings plus learned position embeddings
    ``(B, T, d_model)`` form the residual stream; each layer adds causal multi-head attention
    (:class:`~transformer_lib.multihead.MultiHeadAttention`, named ``layers.0``, ``layers.1``, ...)
    of the stream, LayerNorm-ed first if ``layer_norm``; an unembedding (no bias, not tied) reads
    the final stream, after a last LayerNorm if ``layer_norm``. Weights start as GPT-2's,
    N(0, 0.02), from the global generator.

    :meth:`forward` says what goes in and comes out.
    """

    def __init__(
        self,
        vocab_size: int,
        context_len: int,
        n_layers: int = 2,
        n_heads: int = 4,
        d_model: int = 64,
        *,
        layer_norm: bool = True,
        bias: bool = True,
    ):
        super().__init__()
        for name, value in (("vocab_size", vocab_size), ("context_len", context_len), ("n_layers", n_layers)):
            check_int(value, name)
        check_divisible(d_model, n_heads)
        check_bool(layer_norm, "layer_norm")
        check_bool(bias, "bias")
        self.vocab_size, self.context_len = vocab_size, context_len
        self.tok_embed = nn.Embedding(vocab_size, d_model)
        self.pos_embed = nn.Embedding(context_len, d_model)
        self.layers = nn.ModuleList(MultiHeadAttention(d_model, n_heads, bias=bias) for _ in range(n_layers))

        def norm() -> nn.Module:
            return nn.LayerNorm(d_model, bias=bias) if layer_norm else nn.Identity()

        self.norms = nn.ModuleList(norm() for _ in range(n_layers))
        self.norm_f = norm()
        self.unembed = nn.Linear(d_model, vocab_size, bias=False)
        _init_weights(self)

    def forward(
        self, idx: Tensor, targets: Tensor | None = None, loss_mask: Tensor | None = None
    ) -> tuple[Tensor, Tensor | None]:
        """``idx (B, T)`` token ids -> ``(logits (B, T, vocab_size), loss)``: the mean next-token
        cross-entropy against ``targets (B, T)`` over the positions where ``loss_mask (B, T)``
        (bool) is True (all positions without a mask), None without ``targets``."""
        check_token_ids(idx, self.vocab_size, self.context_len, "idx")
        T = idx.shape[1]
        x = self.tok_embed(idx.long()) + self.pos_embed(torch.arange(T, device=idx.device))  # (B, T, d_model)
        for norm, attn in zip(self.norms, self.layers, strict=True):
            h = norm(x)
            x = x + attn(h, h, h, is_causal=True)[0]  # (B, T, d_model)
        logits = self.unembed(self.norm_f(x))  # (B, T, vocab_size)
        if targets is None:
            if loss_mask is not None:
                raise ValueError("loss_mask chooses where the loss is taken: pass targets too")
            return logits, None
        targets = _check_targets(targets, idx, "idx", self.vocab_size)
        losses = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="none")  # (B * T,)
        if loss_mask is None:
            return logits, losses.mean()
        if not isinstance(loss_mask, Tensor) or loss_mask.dtype != torch.bool or loss_mask.shape != idx.shape:
            raise ValueError(
                f"loss_mask must be a bool tensor of the shape of idx {tuple(idx.shape)}, got "
                f"{getattr(loss_mask, 'dtype', type(loss_mask).__name__)} {tuple(getattr(loss_mask, 'shape', ()))}"
            )
        if not loss_mask.any():
            raise ValueError("loss_mask is False everywhere: there is no position to take the loss on")
        return logits, losses[loss_mask.flatten()].mean()


def ov_circuit(model: AttentionOnly, layer: int, head: int) -> Tensor:
    """Head ``head`` of layer ``layer``'s OV circuit from tokens to logits, ``(V, V)`` (chapter "What attention
    learns").

    ``W_U W_O^i W_V^i E^T``: entry ``[a, b]`` is how much the logit of token ``a`` changes when
    the head attends fully to a position holding only token ``b``'s embedding, with ``E`` the
    token embedding ``(V, d_model)``, ``W_V^i (d_k, d_model)`` the head's rows of the value
    projection, ``W_O^i (d_model, d_k)`` its columns of the output projection and ``W_U`` the
    unembedding ``(V, d_model)``; LayerNorms, biases and positions are left out. Score it with
    :func:`~transformer_lib.inspect_heads.copying_score`.
    """
    if not isinstance(model, AttentionOnly):
        raise TypeError(f"ov_circuit reads an AttentionOnly model, got {type(model).__name__}")
    n_layers = len(model.layers)
    check_index(layer, "layer", n_layers, f"a model with n_layers={n_layers}")
    attn = model.layers[layer]
    check_index(head, "head", attn.n_heads, f"layer {layer}, which has n_heads={attn.n_heads}")
    cols = slice(head * attn.d_k, (head + 1) * attn.d_k)
    W_V = attn.v_proj.weight[cols]  # (d_k, d_model)
    W_O = attn.out_proj.weight[:, cols]  # (d_model, d_k)
    with torch.no_grad():
        return model.unembed.weight @ W_O @ W_V @ model.tok_embed.weight.T  # (V, V)


@torch.no_grad()
def head_scores(model: nn.Module, idx: Tensor, loss_mask: Tensor, distance: Tensor) -> dict[str, dict[str, list]]:
    """Every head's induction and previous-token scores on a batch of repeated sequences (chapter "What attention
    learns").

    ``idx (B, T)``, ``loss_mask (B, T)`` and ``distance (B,)`` as ``repeat_batch(...,
    return_distance=True)`` (:func:`~transformer_lib.data.repeats.repeat_batch`) returns them.
    Returns ``{"induction": {layer name: [h scores]}, "previous_token": {...}}``: per head,
    :func:`~transformer_lib.inspect_heads.induction_score` over the masked queries and
    :func:`~transformer_lib.inspect_heads.previous_token_score`, each averaged over the batch.
    The model runs once, in eval mode (its mode is restored).
    """
    _check_repeat_batch(idx, loss_mask, distance)
    weights = eval_attention(model, idx)
    scores: dict[str, dict[str, list]] = {"induction": {}, "previous_token": {}}
    for name, w in weights.items():  # (B, h, T, T)
        ind = induction_score(w, distance[:, None], loss_mask[:, None, :])  # (B, h)
        scores["induction"][name] = ind.mean(0).tolist()
        scores["previous_token"][name] = previous_token_score(w).mean(0).tolist()
    return scores


def _check_repeat_batch(idx: Tensor, loss_mask: Tensor, distance: Tensor) -> None:
    """``idx (B, T)``, ``loss_mask (B, T)`` bool and ``distance (B,)`` integers, each mask
    position ``t`` at least ``distance`` (a repeat has an earlier occurrence there)."""
    if not isinstance(idx, Tensor) or idx.dim() != 2:
        raise ValueError(f"idx must be a (B, T) tensor of token ids, got {getattr(idx, 'shape', type(idx).__name__)}")
    shape = tuple(idx.shape)
    if not isinstance(loss_mask, Tensor) or loss_mask.dtype != torch.bool or tuple(loss_mask.shape) != shape:
        got = f"{loss_mask.dtype} {tuple(loss_mask.shape)}" if isinstance(loss_mask, Tensor) else repr(loss_mask)
        raise ValueError(f"loss_mask must be a bool tensor of the shape of idx {shape}, got {got}")
    if not isinstance(distance, Tensor) or distance.is_floating_point() or distance.dtype == torch.bool:
        raise TypeError(f"distance must be an integer tensor (B,), got {distance!r}")
    if tuple(distance.shape) != shape[:1]:
        got = tuple(distance.shape)
        raise ValueError(f"distance must have shape (B,) = {shape[:1]}, one per sequence of idx, got {got}")
    early = loss_mask & (torch.arange(shape[1], device=loss_mask.device) < distance.to(loss_mask.device)[:, None])
    if early.any():
        b, t = (int(i) for i in early.nonzero()[0])
        raise ValueError(
            f"loss_mask marks position {t} of sequence {b}, before its distance {int(distance[b])}: the repeat there "
            f"has no earlier occurrence"
        )


def train_on_repeats(
    model: nn.Module,
    steps: int,
    *,
    batch_size: int = 64,
    repeat_len: int = 8,
    lr: float = 3e-3,
    weight_decay: float = 0.01,
    seed: int = 0,
    log_every: int = 50,
    eval_size: int = 256,
    min_distance: int | None = None,
    max_distance: int | None = None,
    on_log: Callable | None = None,
) -> list[dict]:
    """Train ``model`` with AdamW on sequences with a repeat, the loss taken on the repeat (chapter "What attention
    learns").

    ``model`` is an :class:`AttentionOnly` (or any model with ``vocab_size``, ``context_len`` and
    that ``forward``); the sequences, from :func:`~transformer_lib.data.repeats.repeat_batch` with
    ``repeat_len``, fill its context. A ``torch.Generator`` seeded with ``seed`` draws first a
    held-out batch of ``eval_size`` sequences, then ``steps`` training batches of ``batch_size``.

    Returns the history, one dict at step 0, every ``log_every`` steps and at the last step:
    ``{"step": int, "loss": the loss on the repeat of the held-out batch, "train_loss": the last
    training batch's (None at step 0), "induction": {layer name: [score of each head]},
    "previous_token": {...}}`` (see :func:`head_scores`). The model is left in train mode.
    ``min_distance`` and ``max_distance`` go to ``repeat_batch`` (equal: one fixed distance, the
    positional shortcut). ``on_log(step, model, held)``, if given, is called after each record,
    ``held`` being the held-out ``(idx, targets, loss_mask, distance)``: to keep snapshots.
    """
    check_int(steps, "steps", minimum=0)
    for name, value in (("batch_size", batch_size), ("log_every", log_every), ("eval_size", eval_size)):
        check_int(value, name)
    check_int(seed, "seed", minimum=0)
    if not is_real(lr) or not math.isfinite(lr) or lr <= 0:
        raise ValueError(f"lr must be a finite number > 0, got {lr!r}")
    _choose(model, None)  # the model must have attention layers to score
    V, T = model.vocab_size, model.context_len
    check_int(repeat_len, "repeat_len", minimum=2)
    _distance_range(T, repeat_len, min_distance, max_distance, seq_name=f"the model's context_len={T}")
    gen = torch.Generator().manual_seed(seed)
    device = next(model.parameters()).device
    if on_log is not None and not callable(on_log):
        raise TypeError(f"on_log must be a function (step, model, held) or None, got {type(on_log).__name__}")
    spread = {"min_distance": min_distance, "max_distance": max_distance}
    held = repeat_batch(eval_size, T, V, repeat_len, generator=gen, return_distance=True, **spread)
    held = [t.to(device) for t in held]
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    history, train_loss = [], None

    def log(step: int) -> None:
        model.eval()
        with torch.no_grad():
            loss = model(held[0], held[1], held[2])[1].item()
        scores = head_scores(model, held[0], held[2], held[3])
        history.append({"step": step, "loss": loss, "train_loss": train_loss, **scores})
        if on_log is not None:
            on_log(step, model, tuple(held))

    log(0)
    for step in range(1, steps + 1):
        model.train()
        idx, targets, mask = (t.to(device) for t in repeat_batch(batch_size, T, V, repeat_len, generator=gen, **spread))
        _, loss = model(idx, targets, mask)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        train_loss = loss.item()
        if step % log_every == 0 or step == steps:
            log(step)
    model.train()
    return history


def phase_change_step(history: list[dict], threshold: float = 0.3) -> int | None:
    """The first logged step at which some head's induction score reaches ``threshold`` (chapter "What attention
    learns").

    ``history``: the list :func:`train_on_repeats` returns. Returns the step (an int), or None if
    no head of any layer ever reaches ``threshold`` (a number in ``(0, 1)``).
    """
    if not is_real(threshold) or not 0 < threshold < 1:
        raise ValueError(f"threshold must be a number in (0, 1), got {threshold!r}")
    if not isinstance(history, list) or not all(isinstance(r, dict) and "induction" in r for r in history):
        raise TypeError("history must be the list of dicts that train_on_repeats returns")
    for record in history:
        if max(max(scores) for scores in record["induction"].values()) >= threshold:
            return int(record["step"])
    return None


@torch.no_grad()
def loss_by_position(model: nn.Module, idx: Tensor, targets: Tensor) -> Tensor:
    """The next-token loss at each position of the context, ``(T,)`` (chapter "What attention learns").

    ``idx (B, T)`` and ``targets (B, T)`` token ids; ``model(idx)`` returns ``(logits (B, T, V),
    ...)`` as :class:`AttentionOnly` and :class:`~transformer_lib.models.GPT` do. Entry ``t`` is
    the cross-entropy of ``targets[:, t]`` averaged over the batch, in nats: how much the model
    gains from seeing ``t + 1`` tokens of context. The model runs in eval mode (restored after).
    """
    if not isinstance(idx, Tensor) or not isinstance(targets, Tensor) or idx.shape != targets.shape or idx.dim() != 2:
        raise ValueError(
            f"idx and targets must be (B, T) tensors of one shape, got {tuple(getattr(idx, 'shape', ()))} "
            f"and {tuple(getattr(targets, 'shape', ()))}"
        )
    was_training = model.training
    model.eval()
    try:
        logits = model(idx)[0]  # (B, T, V)
    finally:
        model.train(was_training)
    targets = _check_targets(targets, idx, "idx", logits.shape[-1])
    return F.cross_entropy(logits.transpose(1, 2), targets, reduction="none").mean(0)  # (T,)


# Chapter "A GPT from scratch"'s invented language: (singular, plural) nouns and verbs, determiners by number.
_NOUNS = [
    ("cat", "cats"),
    ("dog", "dogs"),
    ("bird", "birds"),
    ("fox", "foxes"),
    ("child", "children"),
    ("mouse", "mice"),
    ("king", "kings"),
    ("horse", "horses"),
]
_INTRANSITIVE = [("sleeps", "sleep"), ("runs", "run"), ("sings", "sing"), ("waits", "wait")]
_TRANSITIVE = [("sees", "see"), ("chases", "chase"), ("likes", "like"), ("follows", "follow")]
_DETS = (["the", "a", "every", "one"], ["the", "some", "two", "all"])
_OBJECT_DETS = (["the", "a"], ["the", "some", "two"])
_ADJECTIVES, _ADJ_P = ["", " small", " red", " quiet", " big", " lazy"], [0.5] + [0.1] * 5
_ADVERBS, _ADV_P = ["", " quietly", " today", " again"], [0.4, 0.2, 0.2, 0.2]


def _sentence(rng) -> str:
    """One sentence of the grammar of chapter "A GPT from scratch", drawn with ``rng`` (a ``random.Random``)."""
    many = rng.random() < 0.5
    subject = f"{rng.choice(_DETS[many])}{rng.choices(_ADJECTIVES, _ADJ_P)[0]} {rng.choice(_NOUNS)[many]}"
    if rng.random() < 0.5:
        rest = f" {rng.choice(_INTRANSITIVE)[many]}{rng.choices(_ADVERBS, _ADV_P)[0]}"
    else:
        other = rng.random() < 0.5
        obj = f"{rng.choice(_OBJECT_DETS[other])}{rng.choices(_ADJECTIVES, _ADJ_P)[0]} {rng.choice(_NOUNS)[other]}"
        rest = f" {rng.choice(_TRANSITIVE)[many]} {obj}"
    return f"{subject}{rest}.\n"


def agreement_text(n_sentences: int, seed: int = 0) -> str:
    """``n_sentences`` random sentences of chapter "A GPT from scratch"'s invented language, one per line (chapter "What
    attention learns").

    A subject (determiner, optional adjective, noun) and a verb that agrees with it in number,
    then an optional adverb or an object: "every small fox chases the mice.". Drawn with
    ``random.Random(seed)``, so the same seed gives the same text.
    """
    import random

    check_int(n_sentences, "n_sentences")
    check_int(seed, "seed", minimum=0)
    rng = random.Random(seed)
    return "".join(_sentence(rng) for _ in range(n_sentences))


def agreement_prompts(n_pairs: int, length: int = 24, seed: int = 0) -> list[tuple[str, str]]:
    """Pairs of prompts that end on a verb stem, the subject singular in one, plural in the other (chapter "What
    attention learns").

    Each pair is ``(singular, plural)``, both ``length`` characters: the end of a random sentence,
    then "the", an optional adjective, a noun whose plural adds an "s" (cat, dog, bird, king,
    horse) and the stem of a verb, as in ``"...s.\\nthe red cat chase"`` and ``"...
    .\\nthe red cats chase"``. The two differ only in the noun's "s" (the singular one keeps one
    more character of the sentence before), so the next character tells whether a model agrees:
    "s" after the singular subject, not "s" after the plural one. ``random.Random(seed)``.
    """
    import random

    check_int(n_pairs, "n_pairs")
    check_int(length, "length", minimum=20)
    check_int(seed, "seed", minimum=0)
    rng = random.Random(seed)
    nouns = [pair for pair in _NOUNS if pair[1] == pair[0] + "s"]
    pairs = []
    for _ in range(n_pairs):
        noun = rng.choice(nouns)[0]
        stem = rng.choice(_INTRANSITIVE + _TRANSITIVE)[1]
        tail = f"the{rng.choices(_ADJECTIVES, _ADJ_P)[0]} {noun}"
        before = "".join(_sentence(rng) for _ in range(3))
        plural = f"{tail}s {stem}"
        keep = length - len(plural)
        pairs.append((before[-keep - 1 :] + f"{tail} {stem}", before[-keep:] + plural))
    return pairs


@torch.no_grad()
def agreement_probability(model: nn.Module, idx: Tensor, singular: Tensor, s_token: int) -> Tensor:
    """The probability that the next character agrees with the subject, per prompt, ``(N,)`` (chapter "What attention
    learns").

    ``idx (N, T)``: prompts that end on a verb stem (see :func:`agreement_prompts`);
    ``singular (N,)`` bool, True where the subject is singular; ``s_token``: the id of "s".
    With ``p`` the model's probability of "s" after the last token, the result is ``p`` for a
    singular subject and ``1 - p`` for a plural one. The model runs in eval mode (restored after).
    """
    if not isinstance(singular, Tensor) or singular.dtype != torch.bool or singular.shape != idx.shape[:1]:
        raise ValueError(f"singular must be a bool tensor of shape (N,) = {tuple(idx.shape[:1])}, got {singular!r}")
    if not is_int(s_token):
        raise TypeError(f"s_token must be a token id (an int), got {s_token!r} ({type(s_token).__name__})")
    was_training = model.training
    model.eval()
    try:
        logits = model(idx)[0][:, -1]  # (N, V)
    finally:
        model.train(was_training)
    check_index(s_token, "s_token", logits.shape[-1], f"a vocabulary of {logits.shape[-1]} tokens")
    p = logits.softmax(-1)[:, s_token]  # (N,)
    return torch.where(singular, p, 1 - p)
