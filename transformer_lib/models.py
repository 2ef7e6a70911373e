"""Complete models: an encoder-decoder :class:`Transformer` (chapter 8) and a decoder-only
:class:`GPT` language model (chapter 9). Each is configured by a small dataclass and runs on any
device (``model.to(device)``); nothing in them assumes one.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .blocks import Decoder, Encoder
from .positional import LearnedPositionalEmbedding, SinusoidalPositionalEncoding

__all__ = ["GPT", "GPTConfig", "Transformer", "TransformerConfig", "check_token_ids"]


def check_token_ids(ids: Tensor, vocab_size: int, max_len: int, name: str = "token ids") -> None:
    """Raise a clear error for ids that are not ``(B, T)`` integers in ``[0, vocab_size)`` or too long.

    The range check reads the tensor's values, which on a GPU forces a host-device
    synchronisation; it is skipped only while a model trains on a GPU (the hot loop), where an
    out-of-range id still fails loudly inside the embedding kernel.
    """
    if not isinstance(ids, Tensor) or ids.dtype not in (torch.int64, torch.int32, torch.int16, torch.uint8):
        raise TypeError(f"{name} must be an integer tensor, got {getattr(ids, 'dtype', type(ids).__name__)}")
    if ids.dim() != 2:
        raise ValueError(f"{name} must have shape (B, T), got {tuple(ids.shape)}")
    if ids.shape[1] > max_len:
        raise ValueError(f"{name}: sequence length {ids.shape[1]} is longer than the model's maximum length {max_len}")
    if ids.numel() and not (ids.is_cuda and torch.is_grad_enabled()) and not torch.compiler.is_compiling():
        lo, hi = int(ids.min()), int(ids.max())
        if lo < 0 or hi >= vocab_size:
            raise ValueError(f"{name} must lie in [0, vocab_size={vocab_size}), got values from {lo} to {hi}")


def _init_weights(module: nn.Module) -> None:
    if isinstance(module, nn.Linear):
        nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.Embedding):
        nn.init.normal_(module.weight, mean=0.0, std=0.02)


@dataclass
class TransformerConfig:
    """Sizes of an encoder-decoder :class:`Transformer` (defaults: small enough for a CPU)."""

    src_vocab_size: int
    tgt_vocab_size: int
    d_model: int = 128
    n_heads: int = 4
    n_encoder_layers: int = 2
    n_decoder_layers: int = 2
    d_ff: int | None = None  # None: 4 * d_model
    dropout: float = 0.1
    max_len: int = 128
    norm_first: bool = False  # False: post-LN as in the paper; True: pre-LN
    positional: str = "sinusoidal"  # or "learned"
    pad_id: int = 0
    bos_id: int = 1
    eos_id: int = 2


class Transformer(nn.Module):
    """Encoder-decoder transformer for sequence-to-sequence tasks (chapter 8).

    ``forward(src (B, T_src), tgt (B, T_tgt), targets=None, need_weights=False)`` returns
    ``(logits (B, T_tgt, tgt_vocab_size), loss or None)``. Padding (``pad_id``) in ``src`` is
    masked out of the encoder's self-attention and the decoder's cross-attention; the decoder's
    self-attention is causal. ``targets`` equal to ``pad_id`` are ignored by the loss.
    """

    def __init__(self, config: TransformerConfig):
        super().__init__()
        c = self.config = config
        if c.positional not in ("sinusoidal", "learned"):
            raise ValueError(f"positional must be 'sinusoidal' or 'learned', got {c.positional!r}")
        self.src_embed = nn.Embedding(c.src_vocab_size, c.d_model)
        self.tgt_embed = nn.Embedding(c.tgt_vocab_size, c.d_model)

        def make_positional() -> nn.Module:
            if c.positional == "sinusoidal":
                return SinusoidalPositionalEncoding(c.d_model, c.max_len, c.dropout)
            return LearnedPositionalEmbedding(c.max_len, c.d_model, c.dropout)

        self.src_pos, self.tgt_pos = make_positional(), make_positional()
        self.encoder = Encoder(c.n_encoder_layers, c.d_model, c.n_heads, c.d_ff, c.dropout, c.norm_first)
        self.decoder = Decoder(c.n_decoder_layers, c.d_model, c.n_heads, c.d_ff, c.dropout, c.norm_first)
        self.lm_head = nn.Linear(c.d_model, c.tgt_vocab_size)
        self.apply(_init_weights)

    def encode(self, src: Tensor, need_weights: bool = False) -> tuple[Tensor, Tensor]:
        """``src (B, T_src)`` -> ``(memory (B, T_src, d_model), src_keep (B, T_src) bool)``."""
        c = self.config
        check_token_ids(src, c.src_vocab_size, c.max_len, "src")
        src_keep = src != c.pad_id  # (B, T_src), True at real tokens
        x = self.src_pos(self.src_embed(src) * math.sqrt(c.d_model))  # (B, T_src, d_model)
        memory = self.encoder(x, mask=src_keep[:, None, None, :], need_weights=need_weights)
        return memory, src_keep

    def decode(self, tgt: Tensor, memory: Tensor, src_keep: Tensor, need_weights: bool = False) -> Tensor:
        """``tgt (B, T_tgt)`` and the encoder's output -> logits ``(B, T_tgt, tgt_vocab_size)``."""
        c = self.config
        check_token_ids(tgt, c.tgt_vocab_size, c.max_len, "tgt")
        y = self.tgt_pos(self.tgt_embed(tgt) * math.sqrt(c.d_model))  # (B, T_tgt, d_model)
        y = self.decoder(y, memory, memory_mask=src_keep[:, None, None, :], need_weights=need_weights)
        return self.lm_head(y)

    def forward(
        self, src: Tensor, tgt: Tensor, targets: Tensor | None = None, need_weights: bool = False
    ) -> tuple[Tensor, Tensor | None]:
        memory, src_keep = self.encode(src, need_weights=need_weights)
        logits = self.decode(tgt, memory, src_keep, need_weights=need_weights)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=self.config.pad_id
            )
        return logits, loss

    @torch.no_grad()
    def greedy_decode(self, src: Tensor, max_new_tokens: int | None = None) -> Tensor:
        """Decode by taking the most likely token at each step (chapter 8).

        Returns ``(B, n)`` generated ids, without the leading ``bos_id``; after a sequence's
        ``eos_id`` the rest of its row is ``pad_id``. Decoding stops when every row has ended.
        """
        c = self.config
        max_new_tokens = c.max_len - 1 if max_new_tokens is None else max_new_tokens
        if max_new_tokens > c.max_len - 1:
            raise ValueError(
                f"max_new_tokens={max_new_tokens} exceeds the model's maximum length - 1 ({c.max_len - 1})"
            )
        memory, src_keep = self.encode(src)
        B = src.shape[0]
        out = torch.full((B, 1), c.bos_id, dtype=torch.long, device=src.device)
        done = torch.zeros(B, dtype=torch.bool, device=src.device)
        for _ in range(max_new_tokens):
            logits = self.decode(out, memory, src_keep)[:, -1]  # (B, V)
            nxt = logits.argmax(dim=-1)
            nxt = torch.where(done, torch.full_like(nxt, c.pad_id), nxt)
            out = torch.cat([out, nxt[:, None]], dim=1)
            done |= nxt == c.eos_id
            if bool(done.all()):
                break
        return out[:, 1:]


@dataclass
class GPTConfig:
    """Sizes of a :class:`GPT` (defaults: nanoGPT's CPU-sized "baby" shape)."""

    vocab_size: int
    block_size: int = 64
    n_layers: int = 4
    n_heads: int = 4
    d_model: int = 128
    dropout: float = 0.0
    bias: bool = True

    def to_dict(self) -> dict:
        return asdict(self)


class GPT(nn.Module):
    """Decoder-only language model (chapter 9): causal self-attention blocks, pre-LN.

    ``forward(idx (B, T), targets=None)`` returns ``(logits (B, T, vocab_size), loss or None)``
    with the next-token cross-entropy loss when ``targets (B, T)`` are given.
    """

    def __init__(self, config: GPTConfig):
        super().__init__()
        c = self.config = config
        self.tok_embed = nn.Embedding(c.vocab_size, c.d_model)
        self.pos_embed = LearnedPositionalEmbedding(c.block_size, c.d_model, c.dropout)
        self.decoder = Decoder(
            c.n_layers,
            c.d_model,
            c.n_heads,
            4 * c.d_model,
            c.dropout,
            norm_first=True,
            cross_attention=False,
            activation="gelu",
            bias=c.bias,
        )
        self.lm_head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        self.apply(_init_weights)
        self.lm_head.weight = self.tok_embed.weight  # weight tying

    def num_params(self, non_embedding: bool = True) -> int:
        """Parameter count; by default without the position embeddings (as in MFU estimates)."""
        n = sum(p.numel() for p in self.parameters())
        return n - self.pos_embed.embedding.weight.numel() if non_embedding else n

    def forward(
        self, idx: Tensor, targets: Tensor | None = None, need_weights: bool = False
    ) -> tuple[Tensor, Tensor | None]:
        c = self.config
        check_token_ids(idx, c.vocab_size, c.block_size, "idx")
        x = self.pos_embed(self.tok_embed(idx))  # (B, T, d_model)
        x = self.decoder(x, need_weights=need_weights)
        logits = self.lm_head(x)  # (B, T, vocab_size)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.reshape(-1, c.vocab_size), targets.reshape(-1))
        return logits, loss

    @torch.no_grad()
    def generate(
        self,
        idx: Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
        generator: torch.Generator | None = None,
    ) -> Tensor:
        """Append ``max_new_tokens`` sampled tokens to ``idx (B, T)``; returns ``(B, T + max_new_tokens)``.

        Logits are divided by ``temperature`` (lower is greedier) and, with ``top_k``, all but the
        ``k`` most likely tokens are removed before sampling. The context is cropped to the
        last ``block_size`` tokens.
        """
        if temperature <= 0:
            raise ValueError(f"temperature must be positive, got {temperature}")
        if top_k is not None and not 1 <= top_k:
            raise ValueError(f"top_k must be a positive int or None, got {top_k}")
        for _ in range(max_new_tokens):
            context = idx[:, -self.config.block_size :]
            logits, _ = self(context)
            logits = logits[:, -1, :] / temperature  # (B, vocab_size)
            if top_k is not None:
                kth = torch.topk(logits, min(top_k, logits.shape[-1])).values[:, -1:]
                logits = logits.masked_fill(logits < kth, float("-inf"))
            probs = torch.softmax(logits, dim=-1)
            nxt = torch.multinomial(probs, num_samples=1, generator=generator)  # (B, 1)
            idx = torch.cat([idx, nxt], dim=1)
        return idx
