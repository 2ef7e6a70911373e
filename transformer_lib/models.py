"""Complete models: an encoder-decoder :class:`Transformer` (chapter 8) and a decoder-only
:class:`GPT` language model (chapter 9). Each is configured by a small dataclass and runs on any
device (``model.to(device)``); nothing in them assumes one.
"""

from __future__ import annotations

import inspect
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ._checks import check_bool, check_divisible, check_int, check_probability, check_temperature
from .blocks import Decoder, DecoderCache, Encoder, scaled_embedding
from .multihead import MultiHeadAttention
from .positional import LearnedPositionalEmbedding, SinusoidalPositionalEncoding
from .sampling import check_top_p, sample_next

__all__ = ["GPT", "GPTConfig", "Transformer", "TransformerConfig", "check_token_ids"]


def check_token_ids(ids: Tensor, vocab_size: int, context_len: int, name: str = "token ids") -> None:
    """Raise a clear error for ids that are not ``(B, T)`` integers in ``[0, vocab_size)`` with
    ``1 <= T <= context_len`` (chapter 8). Every integer dtype is accepted (the models convert
    ids that ``nn.Embedding`` cannot index with to int64); bool, float and complex are not.

    The range check reads the tensor's values, which on a GPU forces a host-device
    synchronisation; it is skipped only while a model trains on a GPU (the hot loop), where an
    out-of-range id still fails loudly inside the embedding kernel.
    """
    _check_id_tensor(ids, name)
    if ids.shape[1] > context_len:
        raise ValueError(f"{name}: sequence length {ids.shape[1]} is longer than context_len={context_len}")
    if ids.numel() and not (ids.is_cuda and torch.is_grad_enabled()) and not torch.compiler.is_compiling():
        lo, hi = int(ids.min()), int(ids.max())
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


def _check_targets(targets: Tensor, ids: Tensor, name: str) -> Tensor:
    """``targets`` as int64 after checking that they are integers of the shape of ``ids``."""
    if not isinstance(targets, Tensor) or targets.dtype.is_floating_point or targets.dtype == torch.bool:
        raise TypeError(f"targets must be an integer tensor, got {getattr(targets, 'dtype', type(targets).__name__)}")
    if targets.shape != ids.shape:
        raise ValueError(f"targets must have the shape of {name} {tuple(ids.shape)}, got {tuple(targets.shape)}")
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
    """Sizes of an encoder-decoder :class:`Transformer` (chapter 8; defaults: small enough for a CPU)."""

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
    n_kv_heads: int | None = None  # chapter 10: grouped-query attention; None: n_heads (standard)

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
    if config.n_kv_heads is not None:
        check_int(config.n_kv_heads, "n_kv_heads")
        if config.n_heads % config.n_kv_heads:
            raise ValueError(f"n_kv_heads ({config.n_kv_heads}) must divide n_heads ({config.n_heads})")
    if getattr(config, "d_ff", None) is not None:
        check_int(config.d_ff, "d_ff")
    check_probability(config.dropout, "dropout")


class Transformer(nn.Module):
    """Encoder-decoder transformer for sequence-to-sequence tasks (chapter 8).

    ``forward(src (B, T_src), tgt (B, T_tgt), targets=None, need_weights=False)`` returns
    ``(logits (B, T_tgt, tgt_vocab_size), loss or None)``. Padding (``pad_id``) in ``src`` is
    masked out of the encoder's self-attention and the decoder's cross-attention; the decoder's
    self-attention is causal. ``targets`` equal to ``pad_id`` are ignored by the loss.

    Chapter 10: ``config.n_kv_heads`` makes every attention grouped-query;
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
        shape = dict(dropout=c.dropout, norm_first=c.norm_first, n_kv_heads=c.n_kv_heads)
        self.encoder = Encoder(c.d_model, c.n_heads, c.n_encoder_layers, c.d_ff, **shape)
        self.decoder = Decoder(c.d_model, c.n_heads, c.n_decoder_layers, c.d_ff, **shape)
        self.lm_head = nn.Linear(c.d_model, c.tgt_vocab_size)
        _init_weights(self)
        # std 1/sqrt(d_model): after scaled_embedding's sqrt(d_model) factor each
        # coordinate has unit variance, the scale of the sinusoidal encoding (chapter 7)
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
        self, tgt: Tensor, memory: Tensor, src_keep: Tensor, need_weights: bool = False,
        cache: DecoderCache | None = None,
    ) -> Tensor:  # fmt: skip
        """``tgt (B, T_tgt)`` and the encoder's output -> logits ``(B, T_tgt, tgt_vocab_size)``.

        With ``cache`` (chapter 10; :meth:`new_cache`), ``tgt`` is still the whole target prefix,
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
                raise ValueError(f"cache must be a DecoderCache that has seen fewer than {tgt.shape[1]} "
                                 f"target positions (model.new_cache()), got {got}")  # fmt: skip
            y = y[:, cache.position :]  # (B, T_new, d_model): the positions not yet cached
        memory_mask = src_keep[:, None, None, :]  # (B, 1, 1, T_src)
        y = self.decoder(y, memory, memory_mask=memory_mask, need_weights=need_weights, cache=cache)
        return self.lm_head(y)

    def new_cache(self) -> DecoderCache:
        """An empty :class:`~transformer_lib.blocks.DecoderCache` for :meth:`decode` (chapter 10):
        per decoder layer, a growing self-attention cache and a static cross-attention one."""
        return self.decoder.new_cache()

    def forward(
        self, src: Tensor, tgt: Tensor, targets: Tensor | None = None, need_weights: bool = False
    ) -> tuple[Tensor, Tensor | None]:
        memory, src_keep = self.encode(src, need_weights=need_weights)
        logits = self.decode(tgt, memory, src_keep, need_weights=need_weights)
        loss = None
        if targets is not None:
            targets = _check_targets(targets, tgt, "tgt")
            loss = F.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=self.config.pad_id
            )
        return logits, loss

    @torch.no_grad()
    def greedy_decode(self, src: Tensor, max_new_tokens: int | None = None, use_cache: bool = True) -> Tensor:
        """Decode by taking the most likely token at each step (chapter 8).

        Returns ``(B, n)`` generated ids, without the leading ``bos_id``; after a sequence's
        ``eos_id`` the rest of its row is ``pad_id``. Decoding stops when every row has ended.
        ``max_new_tokens`` is an int >= 0 (0 gives ``(B, 0)``); ``src`` needs at least one token.

        The source is encoded once. With ``use_cache`` (chapter 10) each step runs the decoder on
        the newest token only: its self-attention keys and values are cached, and each layer's
        cross-attention keys and values of the encoder output are computed once. Without it,
        every step re-decodes the whole prefix; both give the same tokens. (A subclass that
        overrides :meth:`decode` without a ``cache`` argument is decoded without the cache.)
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
        # a subclass whose decode() predates the cache (it takes no `cache`) decodes without one
        cached = use_cache and "cache" in inspect.signature(self.decode).parameters
        options = {"cache": self.new_cache()} if cached else {}
        for _ in range(max_new_tokens):
            logits = self.decode(out, memory, src_keep, **options)[:, -1]  # (B, vocab_size)
            nxt = logits.argmax(dim=-1)
            nxt = torch.where(done, torch.full_like(nxt, c.pad_id), nxt)
            out = torch.cat([out, nxt[:, None]], dim=1)
            done |= nxt == c.eos_id
            if bool(done.all()):
                break
        return out[:, 1:]


@dataclass
class GPTConfig:
    """Sizes of a :class:`GPT` (chapter 9; defaults: nanoGPT's CPU-sized "baby" shape)."""

    vocab_size: int
    context_len: int = 64  # the longest sequence the model reads
    n_layers: int = 4
    n_heads: int = 4
    d_model: int = 128
    dropout: float = 0.0
    bias: bool = True
    n_kv_heads: int | None = None  # chapter 10: grouped-query attention; None: n_heads (standard)
    window: int | None = None  # chapter 10: sliding-window attention over the last `window` positions
    activation: str = "gelu"  # or "gelu_tanh", GPT-2's tanh approximation (chapter 10)

    def __post_init__(self):
        for name in ("vocab_size", "context_len"):
            check_int(getattr(self, name), name)
        check_int(self.n_layers, "n_layers", minimum=0)
        _check_shared(self)
        check_bool(self.bias, "bias")
        if self.window is not None:
            check_int(self.window, "window")
        if self.activation not in ("gelu", "gelu_tanh"):
            raise ValueError(f"activation must be 'gelu' or 'gelu_tanh', got {self.activation!r}")

    def to_dict(self) -> dict:
        """The sizes as a plain dict (what a checkpoint stores)."""
        return asdict(self)


class GPT(nn.Module):
    """Decoder-only language model (chapter 9): causal self-attention blocks, pre-LN.

    ``forward(idx (B, T), targets=None)`` returns ``(logits (B, T, vocab_size), loss or None)``
    with the next-token cross-entropy loss when ``targets (B, T)`` are given.

    Chapter 10: ``config.n_kv_heads`` (grouped-query attention) and ``config.window``
    (sliding-window attention); ``forward(idx, cache=model.new_cache())`` runs only the new
    tokens ``idx (B, T_new)``, placed after the ``cache.position`` tokens already cached, and
    :meth:`generate` uses it.
    """

    def __init__(self, config: GPTConfig):
        super().__init__()
        if not isinstance(config, GPTConfig):
            raise TypeError(f"config must be a GPTConfig, got {type(config).__name__}")
        c = self.config = config
        self.tok_embed = nn.Embedding(c.vocab_size, c.d_model)
        self.pos_embed = LearnedPositionalEmbedding(c.d_model, c.context_len, dropout=c.dropout)
        self.decoder = Decoder(
            c.d_model,
            c.n_heads,
            c.n_layers,
            4 * c.d_model,
            dropout=c.dropout,
            norm_first=True,
            cross_attention=False,
            activation=c.activation,
            bias=c.bias,
            n_kv_heads=c.n_kv_heads,
            window=c.window,
        )
        self.lm_head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        _init_weights(self)
        self.lm_head.weight = self.tok_embed.weight  # weight tying

    def num_params(self, non_embedding: bool = True) -> int:
        """Parameter count; by default without the position embeddings (as in MFU estimates)."""
        n = sum(p.numel() for p in self.parameters())
        return n - self.pos_embed.embedding.weight.numel() if non_embedding else n

    def new_cache(self) -> DecoderCache:
        """An empty :class:`~transformer_lib.blocks.DecoderCache` for ``forward(..., cache=)``
        (chapter 10); with ``config.window`` each layer keeps only the last ``window - 1`` keys."""
        return self.decoder.new_cache()

    def forward(
        self, idx: Tensor, targets: Tensor | None = None, need_weights: bool = False,
        cache: DecoderCache | None = None,
    ) -> tuple[Tensor, Tensor | None]:  # fmt: skip
        c = self.config
        check_token_ids(idx, c.vocab_size, c.context_len, "idx")
        if cache is None:
            x = self.pos_embed(self.tok_embed(_as_index(idx)))  # (B, T, d_model)
        else:
            x = self._embed_at(idx, cache)  # (B, T_new, d_model)
        x = self.decoder(x, need_weights=need_weights, cache=cache)
        logits = self.lm_head(x)  # (B, T, vocab_size)
        loss = None
        if targets is not None:
            targets = _check_targets(targets, idx, "idx")
            loss = F.cross_entropy(logits.reshape(-1, c.vocab_size), targets.reshape(-1))
        return logits, loss

    def _embed_at(self, idx: Tensor, cache: DecoderCache) -> Tensor:
        """Token plus position embeddings of new tokens ``idx (B, T_new)`` that follow the
        ``cache.position`` cached ones: what ``pos_embed`` computes, at positions shifted by the offset."""
        if not isinstance(cache, DecoderCache) or len(cache) != len(self.decoder.layers):
            raise TypeError(f"cache must be this model's DecoderCache (model.new_cache()), got {cache!r}")
        start, end = cache.position, cache.position + idx.shape[1]
        if end > self.config.context_len:
            raise ValueError(
                f"the cache holds {start} positions and idx adds {idx.shape[1]}: {end} is longer than "
                f"context_len={self.config.context_len}"
            )
        pe = self.pos_embed
        positions = torch.arange(start, end, device=idx.device)  # (T_new,)
        return pe.dropout(self.tok_embed(_as_index(idx)) + pe.embedding(positions))  # (B, T_new, d_model)

    @torch.no_grad()
    def generate(
        self,
        idx: Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        generator: torch.Generator | None = None,
        use_cache: bool = True,
    ) -> Tensor:
        """Append ``max_new_tokens`` sampled tokens to ``idx (B, T)``; returns ``(B, T + max_new_tokens)``.

        Logits are divided by ``temperature`` (lower is greedier) and, with ``top_k``, all but the
        ``k`` most likely tokens are removed before sampling
        (:func:`~transformer_lib.sampling.sample_next`). The context is cropped to the last
        ``context_len`` tokens. ``idx`` needs at least one token, ``max_new_tokens`` is an
        int >= 0, ``temperature`` a finite number > 0 and ``top_k`` None or a positive int.

        Chapter 10: ``top_p`` (nucleus sampling, a number in ``(0, 1]``) keeps only the most
        likely tokens that together reach probability ``top_p``. With ``use_cache`` (default)
        the prompt is run once (prefill) and then each step runs only the newest token, reading
        the earlier keys and values from a :class:`~transformer_lib.blocks.DecoderCache`. Once
        the sequence is longer than ``context_len``, the uncached model sees a window that slides
        by one token per step, so every position shifts and no cached key stays valid: from then
        on each step re-runs the cropped window without the cache, exactly as ``use_cache=False``
        does. Cached and uncached generation give the same tokens (the same logits up to
        rounding); the model's train/eval mode is left as it is.
        """
        _check_id_tensor(idx, "idx")
        check_int(max_new_tokens, "max_new_tokens", minimum=0)
        check_temperature(temperature)
        if top_k is not None:
            check_int(top_k, "top_k")
        if top_p is not None:
            check_top_p(top_p)
        check_bool(use_cache, "use_cache")
        L = self.config.context_len
        if not use_cache:
            for _ in range(max_new_tokens):
                logits, _ = self(idx[:, -L:])  # (B, T, vocab_size)
                nxt = sample_next(logits[:, -1, :], temperature, top_k, generator, top_p=top_p)  # (B, 1)
                idx = torch.cat([idx, nxt], dim=1)
            return idx
        cache = self.new_cache()
        for step in range(max_new_tokens):
            if step == 0:
                logits, _ = self(idx[:, -L:], cache=cache)  # prefill: (B, T, vocab_size)
            elif idx.shape[1] <= L:
                logits, _ = self(idx[:, -1:], cache=cache)  # (B, 1, vocab_size)
            else:
                logits, _ = self(idx[:, -L:])  # past context_len: the cropped window, uncached
            nxt = sample_next(logits[:, -1, :], temperature, top_k, generator, top_p=top_p)  # (B, 1)
            idx = torch.cat([idx, nxt], dim=1)
        return idx
