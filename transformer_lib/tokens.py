"""What the choice of tokens changes for a model (chapter "Tokens"): a loss in bits per byte,
which does not depend on the vocabulary, and the small training run the chapter and its recorded
sweep compare a character model and a BPE model with.

A model's loss per token is not comparable across tokenizers: a BPE token carries several
characters, so it is harder to predict than one character and its loss is larger even when the
model predicts the text better. Per byte of text, both pay for the same thing.
"""

from __future__ import annotations

import math
import time

import torch
from torch import Tensor, nn

from ._checks import check_int
from .bpe import BPETokenizer
from .data import CharTokenizer
from .models import GPT, GPTConfig

__all__ = ["TOKEN_RUN", "bits_per_byte", "token_byte_lengths", "token_run"]

#: The settings of the comparison of chapter "Tokens": one model shape, one budget of steps and tokens, for
#: both tokenizers, and the BPE's vocabulary.
TOKEN_RUN = dict(
    n_layers=2,
    n_heads=4,
    d_model=64,
    context_len=64,
    batch_size=16,
    steps=300,
    lr=3e-3,
    val_fraction=0.1,
    bpe_vocab=512,
)


def token_byte_lengths(tokenizer: CharTokenizer | BPETokenizer) -> Tensor:
    """The UTF-8 length of each token id ``(vocab_size,)`` (chapter "Tokens"); special tokens count 0,
    since they are not text."""
    if isinstance(tokenizer, BPETokenizer):
        lengths = [len(b) for b in tokenizer.token_bytes] + [0] * len(tokenizer.specials)
    elif isinstance(tokenizer, CharTokenizer):
        lengths = [0] * len(tokenizer.specials) + [len(c.encode("utf-8")) for c in tokenizer.chars]
    else:
        raise TypeError(f"tokenizer must be a CharTokenizer or a BPETokenizer, got {type(tokenizer).__name__}")
    return torch.tensor(lengths, dtype=torch.long)


@torch.no_grad()
def bits_per_byte(
    model: nn.Module,
    ids: Tensor,
    byte_lengths: Tensor | CharTokenizer | BPETokenizer,
    batch_size: int = 64,
    *,
    windows: bool = False,
) -> dict:
    """The loss of ``model`` on a token stream ``ids (N,)``, per token and per byte (chapter "Tokens").

    The stream is cut into windows of ``model.config.context_len + 1`` tokens that overlap by one,
    so every token after the first is predicted exactly once; ``byte_lengths (vocab_size,)`` gives
    the bytes each predicted token stands for (:func:`token_byte_lengths`; or pass the tokenizer
    itself). Returns ``nats_per_token``, ``bits_per_byte``, ``tokens`` and ``bytes``: bits per byte
    is the total loss in bits over the total bytes predicted. Lengths of another vocabulary's size
    than the model's, and a stream whose predicted tokens hold no byte (special tokens only), are
    refused. With ``windows``, ``"windows"`` lists each window's ``(nats, tokens, bytes)``, the
    items of an interval (chapter "Measuring a model", :func:`~transformer_lib.evaluate.report_card`).
    """
    if isinstance(byte_lengths, (CharTokenizer, BPETokenizer)):
        byte_lengths = token_byte_lengths(byte_lengths)
    T, V = model.config.context_len, model.config.vocab_size
    check_int(batch_size, "batch_size")
    for name, t in (("ids", ids), ("byte_lengths", byte_lengths)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a tensor, got a {type(t).__name__}: use torch.tensor({name})")
        if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
            raise TypeError(f"{name} must be a tensor of integers, got dtype {t.dtype}")
    if ids.dim() != 1 or len(ids) < 2:
        raise ValueError(f"ids must be a token stream (N,) with N >= 2, got shape {tuple(ids.shape)}")
    if tuple(byte_lengths.shape) != (V,):
        raise ValueError(
            f"byte_lengths has shape {tuple(byte_lengths.shape)}, not the model's vocabulary (vocab_size={V},): "
            f"the lengths of another tokenizer? Pass the tokenizer that made ids"
        )
    starts = range(0, len(ids) - 1, T)
    full = [s for s in starts if s + T + 1 <= len(ids)]
    batches = [
        torch.stack([ids[s : s + T + 1] for s in full[i : i + batch_size]]) for i in range(0, len(full), batch_size)
    ]
    batches += [ids[s:][None] for s in starts if s + T + 1 > len(ids)]  # the shorter last window
    total, count, n_bytes, per_window = 0.0, 0, 0, []
    was_training = model.training
    model.eval()
    for w in batches:  # (B, T + 1)
        logits, _ = model(w[:, :-1])
        nll = nn.functional.cross_entropy(logits.double().transpose(1, 2), w[:, 1:], reduction="none").sum(1)
        total, count = total + nll.sum().item(), count + w[:, 1:].numel()
        row_bytes = byte_lengths[w[:, 1:]].sum(1)
        n_bytes += int(row_bytes.sum())
        per_window += [(x, w.shape[1] - 1, int(b)) for x, b in zip(nll.tolist(), row_bytes, strict=True)]
    model.train(was_training)
    if n_bytes == 0:
        raise ValueError(
            f"the {count} predicted tokens stand for 0 bytes (special tokens only?): bits per byte is undefined"
        )
    return {
        "nats_per_token": total / count,
        "bits_per_byte": total / math.log(2) / n_bytes,
        "tokens": count,
        "bytes": n_bytes,
    } | ({"windows": per_window} if windows else {})


def token_run(
    tokenizer: CharTokenizer | BPETokenizer,
    train_text: str,
    val_text: str,
    seed: int,
    *,
    steps: int = TOKEN_RUN["steps"],
    n_layers: int = TOKEN_RUN["n_layers"],
    n_heads: int = TOKEN_RUN["n_heads"],
    d_model: int = TOKEN_RUN["d_model"],
    context_len: int = TOKEN_RUN["context_len"],
    batch_size: int = TOKEN_RUN["batch_size"],
    lr: float = TOKEN_RUN["lr"],
    dtype: torch.dtype = torch.float32,
    **model_options,
) -> dict:
    """Train a :class:`~transformer_lib.models.GPT` on ``train_text`` read by ``tokenizer`` and
    measure it on ``val_text`` (chapter "Tokens"). Both tokenizers get the same model shape, the same
    steps and the same tokens per step; only the vocabulary (its embedding rows) differs.

    AdamW at a constant ``lr`` with no weight decay; batches of random windows from a generator
    seeded with ``seed``. ``model_options`` are further :class:`~transformer_lib.models.GPTConfig`
    settings (the block of chapter "Today's block": ``norm``, ``ffn``, ``positions``, ``qk_norm``, ``bias``). Returns
    the validation loss of :func:`bits_per_byte`, the training loss of every step (``losses``), the
    training time, the model (trained, in eval mode) and its token embeddings before training.
    """
    train_ids = torch.tensor(tokenizer.encode(train_text), dtype=torch.long)
    val_ids = torch.tensor(tokenizer.encode(val_text), dtype=torch.long)
    torch.manual_seed(seed)
    config = GPTConfig(tokenizer.vocab_size, context_len, n_layers, n_heads, d_model, **model_options)
    model = GPT(config).to(dtype)
    initial = model.tok_embed.weight.detach().clone()
    optimiser = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    generator = torch.Generator().manual_seed(seed)
    start, losses = time.perf_counter(), []
    model.train()
    for _ in range(steps):
        starts = torch.randint(len(train_ids) - context_len, (batch_size,), generator=generator)
        window = train_ids[starts[:, None] + torch.arange(context_len + 1)]  # (B, T + 1)
        _, loss = model(window[:, :-1], window[:, 1:])
        optimiser.zero_grad(set_to_none=True)
        loss.backward()
        optimiser.step()
        losses.append(loss.item())
    seconds = time.perf_counter() - start
    model.eval()
    return {
        **bits_per_byte(model, val_ids, token_byte_lengths(tokenizer)),
        "train_tokens": len(train_ids),
        "seconds": seconds,
        "losses": losses,
        "model": model,
        "initial_embedding": initial,
    }
