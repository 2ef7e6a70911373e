"""The encoder-decoder :class:`Transformer` (chapter "Encoder-decoder and cross-attention", "Encoder-decoder"),
configured by a small dataclass, and the checks of token ids that it and the decoder-only
:class:`~transformer_lib.models.GPT` share. It runs on any device (``model.to(device)``); nothing in it assumes one.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ._checks import check_bool, check_divisible, check_int, check_kv_heads, check_probability
from .blocks import Decoder, Encoder, scaled_embedding
from .kv_cache import DecoderCache
from .multihead import MultiHeadAttention
from .positional import LearnedPositionalEmbedding, SinusoidalPositionalEncoding

__all__ = ["Transformer", "TransformerConfig", "check_token_ids"]


def check_token_ids(ids: Tensor, vocab_size: int, context_len: int, name: str = "token ids") -> None:
    """Raise a clear error for ids that are not ``(B, T)`` integers in ``[0, vocab_size)`` with
    ``1 <= T <= context_len`` (chapter "Encoder-decoder and cross-attention"). Every integer dtype is accepted (the
    models convert ids that ``nn.Embedding`` cannot index with to int64); bool, float and complex are not.

    The range check reads the tensor's values, which on a GPU forces a host-device
    synchronisation; it is skipped only while a model trains on a GPU (the hot loop), where an
    out-of-range id still fails loudly inside the embedding kernel.
    """
    _check_id_tensor(ids, name)
    if ids.shape[1] > context_len:
        raise ValueError(f"{name}: sequence length {ids.shape[1]} is longer than context_len={context_len}")
    if ids.numel() and not (ids.is_cuda and torch.is_grad_enabled()) and not torch.compiler.is_compiling():
        lo, hi = (int(v) for v in torch.aminmax(ids))  # one pass over the ids
        if lo < 0 or hi >= vocab_size:
            raise ValueError(f"{name} must lie in [0, vocab_size={vocab_size}), got values from {lo} to {hi}")


def _check_id_tensor(ids: Tensor, name: str) -> None:
    """Type, dtype and shape of a ``(B, T)`` batch of ids with ``T >= 1``; no data is read."""
    kind = ids.dtype if isinstance(ids, Tensor) else type(ids).__name__
    if not isinstance(ids, Tensor) or ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
        raise TypeError(f"{name} must be an integer tensor, got {kind}")
    if ids.dim() != 2:
        raise ValueError(f"{name} must have shape (B, T), got {tuple(ids.shape)}")
    if ids.shape[1] == 0:
        raise ValueError(f"{name} is empty: a sequence needs at least one token, got shape {tuple(ids.shape)}")


def _as_index(ids: Tensor) -> Tensor:
    """``ids`` in a dtype ``nn.Embedding`` and the loss accept: int32 and int64 as they are, else int64."""
    return ids if ids.dtype in (torch.int64, torch.int32) else ids.long()


def _check_targets(targets: Tensor, ids: Tensor, name: str, vocab_size: int | None = None) -> Tensor:
    """``targets`` as int64 after checking that they are integers of the shape of ``ids`` and,
    given ``vocab_size``, in ``[0, vocab_size)`` (a negative target would otherwise be an
    ``IndexError`` deep in the loss, or, at -100, silently left out of it). The range is read as
    :func:`check_token_ids` reads it (not while a model trains on a GPU)."""
    if not isinstance(targets, Tensor) or targets.dtype.is_floating_point or targets.dtype == torch.bool:
        raise TypeError(f"targets must be an integer tensor, got {getattr(targets, 'dtype', type(targets).__name__)}")
    if targets.shape != ids.shape:
        raise ValueError(f"targets must have the shape of {name} {tuple(ids.shape)}, got {tuple(targets.shape)}")
    if vocab_size is not None and targets.numel() and not (targets.is_cuda and torch.is_grad_enabled()):
        if not torch.compiler.is_compiling():
            lo, hi = (int(v) for v in torch.aminmax(targets))
            if lo < 0 or hi >= vocab_size:
                raise ValueError(f"targets must lie in [0, vocab_size={vocab_size}), got values from {lo} to {hi}")
    return targets.long()


def _init_weights(model: nn.Module) -> None:
    """GPT-2's initialisation: N(0, 0.02) for every linear and embedding weight, zero biases.

    Modules are visited parent first, so a :class:`MultiHeadAttention`'s fused Q, K, V rows are
    drawn before its output projection, in the order of three separate linear layers.
    """
    for module in model.modules():
        _init_module(module)


def _init_module(module: nn.Module) -> None:
    if isinstance(module, MultiHeadAttention):
        for proj in (module.q_proj, module.k_proj, module.v_proj):
            nn.init.normal_(proj.weight, mean=0.0, std=0.02)
            if proj.bias is not None:
                nn.init.zeros_(proj.bias)
    elif isinstance(module, nn.Linear):
        nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.Embedding):
        nn.init.normal_(module.weight, mean=0.0, std=0.02)


@dataclass
class TransformerConfig:
    """Sizes of an encoder-decoder :class:`Transformer` (chapter "Encoder-decoder and cross-attention"; defaults: small
    enough for a CPU)."""

    src_vocab_size: int
    tgt_vocab_size: int
    d_model: int = 128
    n_heads: int = 4
    n_encoder_layers: int = 2
    n_decoder_layers: int = 2
    d_ff: int | None = None  # None: 4 * d_model
    dropout: float = 0.1
    context_len: int = 128  # the longest source or target sequence
    norm_first: bool = False  # False: post-LN as in the paper; True: pre-LN
    positional: str = "sinusoidal"  # or "learned"
    pad_id: int = 0
    bos_id: int = 1
    eos_id: int = 2
    n_kv_heads: int | None = None  # chapter "Generation": grouped-query attention; None: n_heads (standard)

    def __post_init__(self):
        for name in ("src_vocab_size", "tgt_vocab_size", "context_len"):
            check_int(getattr(self, name), name)
        for name in ("n_encoder_layers", "n_decoder_layers"):
            check_int(getattr(self, name), name, minimum=0)
        _check_shared(self)
        check_bool(self.norm_first, "norm_first")
        if self.positional not in ("sinusoidal", "learned"):
            raise ValueError(f"positional must be 'sinusoidal' or 'learned', got {self.positional!r}")
        vocab = min(self.src_vocab_size, self.tgt_vocab_size)
        for name, size in (("pad_id", vocab), ("bos_id", self.tgt_vocab_size), ("eos_id", self.tgt_vocab_size)):
            check_int(getattr(self, name), name, minimum=0)
            if getattr(self, name) >= size:
                raise ValueError(f"{name}={getattr(self, name)} lies outside the vocabulary [0, {size})")


def _check_shared(config) -> None:
    """The fields both configs have: ``d_model``, ``n_heads``, ``n_kv_heads``, ``d_ff`` (if any)
    and ``dropout``."""
    check_divisible(config.d_model, config.n_heads)
    check_kv_heads(config.n_kv_heads, config.n_heads)
    if getattr(config, "d_ff", None) is not None:
        check_int(config.d_ff, "d_ff")
    check_probability(config.dropout, "dropout")


class Transformer(nn.Module):
    """Encoder-decoder transformer for sequence-to-sequence tasks (chapter "Encoder-decoder and cross-attention").

    ``forward(src (B, T_src), tgt (B, T_tgt), targets=None, need_weights=False)`` returns
    ``(logits (B, T_tgt, tgt_vocab_size), loss or None)``. Padding (``pad_id``) in ``src`` is
    masked out of the encoder's self-attention and the decoder's cross-attention; the decoder's
    self-attention is causal. ``targets`` equal to ``pad_id`` are ignored by the loss.

    Chapter "Generation": ``config.n_kv_heads`` makes every attention grouped-query;
    :meth:`greedy_decode` caches keys and values (:meth:`new_cache`).
    """

    def __init__(self, config: TransformerConfig):
        super().__init__()
        if not isinstance(config, TransformerConfig):
            raise TypeError(f"config must be a TransformerConfig, got {type(config).__name__}")
        c = self.config = config
        self.src_embed = nn.Embedding(c.src_vocab_size, c.d_model)
        self.tgt_embed = nn.Embedding(c.tgt_vocab_size, c.d_model)

        def make_positional() -> nn.Module:
            if c.positional == "sinusoidal":
                return SinusoidalPositionalEncoding(c.d_model, c.context_len, dropout=c.dropout)
            return LearnedPositionalEmbedding(c.d_model, c.context_len, dropout=c.dropout)

        self.src_pos, self.tgt_pos = make_positional(), make_positional()
        shape = dict(dropout=c.dropout, norm_first=c.norm_first, n_kv_heads=c.n_kv_heads, _checked=True)
        self.encoder = Encoder(c.d_model, c.n_heads, c.n_encoder_layers, c.d_ff, **shape)
        self.decoder = Decoder(c.d_model, c.n_heads, c.n_decoder_layers, c.d_ff, **shape)
        self.lm_head = nn.Linear(c.d_model, c.tgt_vocab_size)
        _init_weights(self)
        # std 1/sqrt(d_model): after scaled_embedding's sqrt(d_model) factor each
        # coordinate has unit variance, the scale of the sinusoidal encoding (chapter "The transformer block")
        for embed in (self.src_embed, self.tgt_embed):
            nn.init.normal_(embed.weight, mean=0.0, std=c.d_model**-0.5)

    def encode(self, src: Tensor, need_weights: bool = False) -> tuple[Tensor, Tensor]:
        """``src (B, T_src)`` -> ``(memory (B, T_src, d_model), src_keep (B, T_src) bool)``."""
        c = self.config
        check_token_ids(src, c.src_vocab_size, c.context_len, "src")
        src_keep = src != c.pad_id  # (B, T_src), True at real tokens
        x = self.src_pos(scaled_embedding(self.src_embed, _as_index(src)))  # (B, T_src, d_model)
        memory = self.encoder(x, mask=src_keep[:, None, None, :], need_weights=need_weights)
        return memory, src_keep

    def decode(
        self,
        tgt: Tensor,
        memory: Tensor,
        src_keep: Tensor,
        need_weights: bool = False,
        cache: DecoderCache | None = None,
    ) -> Tensor:
        """``tgt (B, T_tgt)`` and the encoder's output -> logits ``(B, T_tgt, tgt_vocab_size)``.

        With ``cache`` (chapter "Generation"; :meth:`new_cache`), ``tgt`` is still the whole target prefix,
        but only the positions the cache has not seen (from ``cache.position`` on) go through
        the decoder, and only their logits ``(B, T_tgt - cache.position, tgt_vocab_size)`` come
        back; the cross-attention keys and values of ``memory`` are computed once, at the first call.
        """
        c = self.config
        check_token_ids(tgt, c.tgt_vocab_size, c.context_len, "tgt")
        y = self.tgt_pos(scaled_embedding(self.tgt_embed, _as_index(tgt)))  # (B, T_tgt, d_model)
        if cache is not None:
            if not isinstance(cache, DecoderCache) or not cache.position < tgt.shape[1]:
                got = f"position {cache.position}" if isinstance(cache, DecoderCache) else type(cache).__name__
                raise ValueError(
                    f"cache must be a DecoderCache that has seen fewer than {tgt.shape[1]} "
                    f"target positions (model.new_cache()), got {got}"
                )
            y = y[:, cache.position :]  # (B, T_new, d_model): the positions not yet cached
        memory_mask = src_keep[:, None, None, :]  # (B, 1, 1, T_src)
        y = self.decoder(y, memory, memory_mask=memory_mask, need_weights=need_weights, cache=cache)
        return self.lm_head(y)

    def new_cache(self) -> DecoderCache:
        """An empty :class:`~transformer_lib.blocks.DecoderCache` for :meth:`decode` (chapter "Generation"):
        per decoder layer, a growing self-attention cache and a static cross-attention one."""
        return self.decoder.new_cache()

    def forward(
        self, src: Tensor, tgt: Tensor, targets: Tensor | None = None, need_weights: bool = False
    ) -> tuple[Tensor, Tensor | None]:
        """``src (B, T_src)`` and ``tgt (B, T_tgt)`` token ids -> ``(logits (B, T_tgt,
        tgt_vocab_size), loss)``: the cross-entropy against ``targets (B, T_tgt)`` when given
        (positions whose target is ``pad_id`` left out), else None. ``need_weights``: each layer
        keeps its attention weights (see :class:`~transformer_lib.blocks.DecoderLayer`)."""
        memory, src_keep = self.encode(src, need_weights=need_weights)
        logits = self.decode(tgt, memory, src_keep, need_weights=need_weights)
        loss = None
        if targets is not None:
            targets = _check_targets(targets, tgt, "tgt")
            if not (targets.is_cuda and torch.is_grad_enabled()) and not (targets != self.config.pad_id).any():
                raise ValueError(
                    f"every target is padding (pad_id={self.config.pad_id}): the loss has no token to average "
                    f"over; give at least one real target, or drop this batch"
                )
            loss = F.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=self.config.pad_id
            )
        return logits, loss

    @torch.no_grad()
    def greedy_decode(self, src: Tensor, max_new_tokens: int | None = None, use_cache: bool = True) -> Tensor:
        """Decode by taking the most likely token at each step (chapter "Encoder-decoder and cross-attention").

        Returns ``(B, n)`` generated ids, without the leading ``bos_id``; after a sequence's
        ``eos_id`` the rest of its row is ``pad_id``. Decoding stops when every row has ended.
        ``max_new_tokens`` is an int >= 0 (0 gives ``(B, 0)``); ``src`` needs at least one token.

        The source is encoded once. With ``use_cache`` (chapter "Generation") each step runs the decoder on
        the newest token only: its self-attention keys and values are cached, and each layer's
        cross-attention keys and values of the encoder output are computed once. Without it,
        every step re-decodes the whole prefix; both give the same tokens. A subclass whose
        :meth:`decode` takes no ``cache`` keyword is decoded without the cache.
        """
        c = self.config
        max_new_tokens = c.context_len - 1 if max_new_tokens is None else max_new_tokens
        check_int(max_new_tokens, "max_new_tokens", minimum=0)
        check_bool(use_cache, "use_cache")
        if max_new_tokens > c.context_len - 1:
            raise ValueError(
                f"max_new_tokens={max_new_tokens} exceeds the model's context_len - 1 ({c.context_len - 1})"
            )
        memory, src_keep = self.encode(src)
        B = src.shape[0]
        out = torch.full((B, 1), c.bos_id, dtype=torch.long, device=src.device)
        done = torch.zeros(B, dtype=torch.bool, device=src.device)
        step_kwargs = {"cache": self.new_cache() if use_cache else None}
        for step in range(max_new_tokens):
            try:
                logits = self.decode(out, memory, src_keep, **step_kwargs)[:, -1]  # (B, vocab_size)
            except TypeError as err:
                if step or "'cache'" not in str(err):
                    raise
                step_kwargs = {}  # a subclass's decode without ``cache``: re-decode the prefix each step
                logits = self.decode(out, memory, src_keep)[:, -1]
            nxt = logits.argmax(dim=-1)
            nxt = torch.where(done, torch.full_like(nxt, c.pad_id), nxt)
            out = torch.cat([out, nxt[:, None]], dim=1)
            done |= nxt == c.eos_id
            if bool(done.all()):
                break
        return out[:, 1:]
