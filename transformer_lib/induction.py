"""Induction heads (chapter 11, "What attention learns"): a small attention-only transformer,
its heads' OV circuits, and the training run on repeated sequences whose history shows the
phase change in which induction heads form.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ._checks import check_bool, check_divisible, check_int, is_int, is_real
from .data.repeats import repeat_batch
from .encoder_decoder import _check_targets, _init_weights, check_token_ids
from .inspect_heads import _choose, capture_attention, induction_score, previous_token_score
from .multihead import MultiHeadAttention

__all__ = ["AttentionOnly", "head_scores", "ov_circuit", "train_on_repeats"]


class AttentionOnly(nn.Module):
    """A transformer with attention layers only, no feed-forward networks (chapter 11).

    ``AttentionOnly(vocab_size, context_len, n_layers=2, n_heads=4, d_model=64, *,
    layer_norm=True, bias=True)``: token embeddings plus learned position embeddings
    ``(B, T, d_model)`` form the residual stream; each layer adds causal multi-head attention
    (:class:`~transformer_lib.multihead.MultiHeadAttention`, named ``layers.0``, ``layers.1``, ...)
    of the stream, LayerNorm-ed first if ``layer_norm``; an unembedding (no bias, not tied) reads
    the final stream, after a last LayerNorm if ``layer_norm``. Weights start as GPT-2's,
    N(0, 0.02), from the global generator.

    ``forward(idx (B, T), targets=None, loss_mask=None)`` returns ``(logits (B, T, vocab_size),
    loss)``: the mean next-token cross-entropy over the positions where ``loss_mask (B, T)``
    (bool) is True (all positions without a mask), None without ``targets``.
    """

    def __init__(
        self, vocab_size: int, context_len: int, n_layers: int = 2, n_heads: int = 4, d_model: int = 64, *,
        layer_norm: bool = True, bias: bool = True,
    ):  # fmt: skip
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
        targets = _check_targets(targets, idx, "idx")
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
    """Head ``head`` of layer ``layer``'s OV circuit from tokens to logits, ``(V, V)`` (chapter 11).

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
    if not is_int(layer) or not 0 <= layer < n_layers:
        raise ValueError(f"layer {layer!r} is out of range for a model with n_layers={n_layers}")
    attn = model.layers[layer]
    if not is_int(head) or not 0 <= head < attn.n_heads:
        raise ValueError(f"head {head!r} is out of range for layer {layer}, which has n_heads={attn.n_heads}")
    cols = slice(head * attn.d_k, (head + 1) * attn.d_k)
    W_V = attn.v_proj.weight[cols]  # (d_k, d_model)
    W_O = attn.out_proj.weight[:, cols]  # (d_model, d_k)
    with torch.no_grad():
        return model.unembed.weight @ W_O @ W_V @ model.tok_embed.weight.T  # (V, V)


@torch.no_grad()
def head_scores(model: nn.Module, idx: Tensor, loss_mask: Tensor, distance: Tensor) -> dict[str, dict[str, list]]:
    """Every head's induction and previous-token scores on a batch of repeated sequences (chapter 11).

    ``idx (B, T)``, ``loss_mask (B, T)`` and ``distance (B,)`` as ``repeat_batch(...,
    return_distance=True)`` (:func:`~transformer_lib.data.repeats.repeat_batch`) returns them.
    Returns ``{"induction": {layer name: [h scores]}, "previous_token": {...}}``: per head,
    :func:`~transformer_lib.inspect_heads.induction_score` over the masked queries and
    :func:`~transformer_lib.inspect_heads.previous_token_score`, each averaged over the batch.
    The model runs once, in eval mode (its mode is restored).
    """
    was_training = model.training
    model.eval()
    try:
        with capture_attention(model) as weights:
            model(idx)
    finally:
        model.train(was_training)
    scores: dict[str, dict[str, list]] = {"induction": {}, "previous_token": {}}
    for name, w in weights.items():  # (B, h, T, T)
        ind = induction_score(w, distance[:, None], loss_mask[:, None, :])  # (B, h)
        scores["induction"][name] = ind.mean(0).tolist()
        scores["previous_token"][name] = previous_token_score(w).mean(0).tolist()
    return scores


def train_on_repeats(
    model: nn.Module, steps: int, *, batch_size: int = 64, repeat_len: int = 8, lr: float = 3e-3,
    weight_decay: float = 0.01, seed: int = 0, log_every: int = 50, eval_size: int = 256,
) -> list[dict]:  # fmt: skip
    """Train ``model`` with AdamW on sequences with a repeat, the loss taken on the repeat (chapter 11).

    ``model`` is an :class:`AttentionOnly` (or any model with ``vocab_size``, ``context_len`` and
    that ``forward``); the sequences, from :func:`~transformer_lib.data.repeats.repeat_batch` with
    ``repeat_len``, fill its context. A ``torch.Generator`` seeded with ``seed`` draws first a
    held-out batch of ``eval_size`` sequences, then ``steps`` training batches of ``batch_size``.

    Returns the history, one dict at step 0, every ``log_every`` steps and at the last step:
    ``{"step": int, "loss": the loss on the repeat of the held-out batch, "train_loss": the last
    training batch's (None at step 0), "induction": {layer name: [score of each head]},
    "previous_token": {...}}`` (see :func:`head_scores`). The model is left in train mode.
    """
    check_int(steps, "steps", minimum=0)
    for name, value in (("batch_size", batch_size), ("log_every", log_every), ("eval_size", eval_size)):
        check_int(value, name)
    check_int(seed, "seed", minimum=0)
    if not is_real(lr) or not math.isfinite(lr) or lr <= 0:
        raise ValueError(f"lr must be a finite number > 0, got {lr!r}")
    _choose(model, None)  # the model must have attention layers to score
    V, T = model.vocab_size, model.context_len
    gen = torch.Generator().manual_seed(seed)
    device = next(model.parameters()).device
    held = [t.to(device) for t in repeat_batch(eval_size, T, V, repeat_len, generator=gen, return_distance=True)]
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    history, train_loss = [], None

    def log(step: int) -> None:
        model.eval()
        with torch.no_grad():
            loss = model(held[0], held[1], held[2])[1].item()
        scores = head_scores(model, held[0], held[2], held[3])
        history.append({"step": step, "loss": loss, "train_loss": train_loss, **scores})

    log(0)
    for step in range(1, steps + 1):
        model.train()
        idx, targets, mask = (t.to(device) for t in repeat_batch(batch_size, T, V, repeat_len, generator=gen))
        _, loss = model(idx, targets, mask)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        train_loss = loss.item()
        if step % log_every == 0 or step == steps:
            log(step)
    model.train()
    return history
