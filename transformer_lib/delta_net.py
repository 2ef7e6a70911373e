"""Gated DeltaNet, the linear-attention layer of Qwen3-Next (chapter "Attention as a recurrence").

Each token, from ``x (B, T, d_model)``:

1. ``in_proj`` makes the queries, keys and values of every head in one matrix product; a short
   causal depthwise convolution (``conv_kernel`` taps, each channel its own) mixes each channel with
   the few tokens before it, then SiLU;
2. queries and keys are L2-normalised per head, queries scaled by ``1 / sqrt(d_k)``; ``n_qk_heads``
   query-key heads are shared by the ``n_heads`` value heads as keys and values are in grouped-query
   attention (value head ``i`` reads query-key head ``i // (n_heads / n_qk_heads)``);
3. per value head, a write strength ``beta_t = sigmoid(beta_proj(x))`` and a log decay
   ``g_t = -exp(log_rate) softplus(decay_proj(x) + step_bias)`` (a rate times a positive time step);
4. the gated delta rule (:func:`~transformer_lib.linear_attention.delta_rule`) reads and writes a
   state ``(d_k, d_v)`` per head;
5. each head's output is RMS-normalised and multiplied by ``silu(gate_proj(x))``, the heads merged
   and mapped back by ``out_proj``.

A :class:`RecurrentState` is the whole cache: the state and the last ``conv_kernel - 1`` inputs of
the convolution, the same size after ten tokens or a million.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ._checks import check_float_tensors, check_int
from ._specs import Spec, option
from .kv_cache import select_rows
from .linear_attention import delta_rule, delta_rule_weights, l2_normalize, linear_attention, linear_attention_weights
from .modern_block import RMSNorm
from .multihead import RecordsScores

__all__ = [
    "DECAY_INITS",
    "DELTA_MODES",
    "GatedDeltaNet",
    "RecurrenceSpec",
    "RecurrentState",
    "decay_init",
    "keep_per_token",
]

DELTA_MODES = ("gated", "delta", "linear")
DECAY_INITS = ("reference", "transformers")  # the starting values of log_rate and step_bias
STEP_RANGE = (1e-3, 1e-1)  # the reference's time steps at the start, log-uniform
STEP_FLOOR = 1e-4
_default_init = ["reference"]  # what a layer built with init=None starts from (see decay_init)


@contextlib.contextmanager
def decay_init(init: str):
    """Layers built inside ``with decay_init(init):`` with ``init=None`` (as a GPT builds them)
    start from ``init`` (:data:`DECAY_INITS`); the default is ``"reference"`` again after it (chapter "Attention as a
    recurrence")."""
    _check_init(init)
    before = _default_init[0]
    _default_init[0] = init
    try:
        yield
    finally:
        _default_init[0] = before


def keep_per_token(layer: GatedDeltaNet) -> Tensor:
    """``(n_heads,)``: the share of its state each head of ``layer`` keeps per token when
    ``decay_proj(x)`` is 0, ``exp(-exp(log_rate) softplus(step_bias))`` (chapter "Attention as a recurrence")."""
    with torch.no_grad():
        return torch.exp(-layer.log_rate.exp() * F.softplus(layer.step_bias))


class RecurrentState:
    """The cache of a recurrent layer such as :class:`GatedDeltaNet` (chapter "Attention as a recurrence").

    ``state (B, h, d_k, d_v)``, the recurrence's matrix per head, and ``conv (B, channels, kernel - 1)``,
    the last inputs of the short convolution (None while empty). ``position``: tokens seen so far;
    ``length`` is the same number (what a key-value cache would hold: here nothing grows with it).
    ``nbytes()`` is the memory held, constant in the number of tokens. It stands where a
    :class:`~transformer_lib.kv_cache.KVCache` stands in a :class:`~transformer_lib.blocks.DecoderLayer`.
    """

    def __init__(self):
        self.state: Tensor | None = None  # (B, h, d_k, d_v)
        self.conv: Tensor | None = None  # (B, channels, kernel - 1)
        self.position = 0

    @property
    def length(self) -> int:
        """The tokens seen, as ``position``."""
        return self.position

    @property
    def filled(self) -> bool:
        """True once a token has passed."""
        return self.state is not None

    def nbytes(self) -> int:
        """Bytes taken by the state and the convolution's inputs."""
        return sum(t.numel() * t.element_size() for t in (self.state, self.conv) if t is not None)

    def check(self, state_shape: tuple, conv_shape: tuple, dtype=None, conv_dtype=None) -> None:
        """Raise unless a filled cache holds a state of ``state_shape`` (and ``dtype``) and convolution inputs
        of ``conv_shape`` (and ``conv_dtype``, default ``dtype``); a dtype of None is not checked."""
        if self.state is None:
            return
        conv_dtype = dtype if conv_dtype is None else conv_dtype
        held = (tuple(self.state.shape), tuple(self.conv.shape), self.state.dtype, self.conv.dtype)
        want = (tuple(state_shape), tuple(conv_shape), dtype or held[2], conv_dtype or held[3])
        if held != want:
            raise ValueError(
                f"RecurrentState holds a state {held[0]} of {held[2]} and convolution inputs {held[1]} of {held[3]}; "
                f"this call needs {tuple(state_shape)} of {dtype} and {tuple(conv_shape)} of {conv_dtype} (a "
                "different batch, layer or dtype: start a new cache)"
            )

    def update(self, state: Tensor, conv: Tensor, T_new: int) -> None:
        """Keep the new ``state`` and ``conv`` inputs, after ``T_new`` more tokens."""
        self.state, self.conv = state, conv
        self.position += T_new

    def reset(self) -> None:
        """Empty the cache."""
        self.state = self.conv = None
        self.position = 0

    def crop(self, n: int) -> None:
        """The protocol of chapter "Generation" (:mod:`~transformer_lib.kv_cache`): going back is possible only to where
        the state is (``n = position``) or to the start (``n = 0``). The state has added every token into
        one matrix; the state after ``n`` tokens is not kept, so any other ``n`` is refused by name."""
        check_int(n, "n", minimum=0)
        if n > self.position:
            raise ValueError(f"cannot crop this RecurrentState to n={n}: it has seen {self.position} tokens")
        if n == 0:
            self.reset()
        elif n != self.position:
            raise ValueError(
                f"cannot crop this RecurrentState to n={n}: its state mixed all {self.position} tokens into one "
                "matrix and keeps no earlier one (decode again from the prompt)"
            )

    def select(self, rows) -> None:
        """Keep the batch rows ``rows`` of the state and the convolution's inputs."""
        if self.state is None:
            return
        index = select_rows(rows, self.state.shape[0], "this RecurrentState")
        self.state, self.conv = self.state[index], self.conv[index]

    def __repr__(self) -> str:
        shapes = None if self.state is None else (tuple(self.state.shape), tuple(self.conv.shape))
        return f"RecurrentState(shapes={shapes}, position={self.position})"


class GatedDeltaNet(RecordsScores, nn.Module):
    """Gated DeltaNet, Qwen3-Next's linear-attention layer (chapter "Attention as a recurrence"). Causal self-attention
    only.

    ``GatedDeltaNet(d_model, n_heads, *, n_qk_heads=None, d_k=None, d_v=None, conv_kernel=4,
    mode="gated", chunk_size=64, eps=1e-6, init=None)``; ``n_heads`` value heads, ``n_qk_heads`` (default
    ``n_heads``, must divide it) query-key heads, ``d_k`` (default ``d_model // n_heads``) and ``d_v``
    (default ``d_k``) their widths. Its maps, none with a bias:

    - ``in_proj`` (``d_model -> 2 n_qk_heads d_k + n_heads d_v``): all queries, all keys, all values,
      each head after head; ``conv`` (``nn.Conv1d``, depthwise, causal) over those channels;
    - ``beta_proj`` and ``decay_proj`` (``d_model -> n_heads``), with ``log_rate`` and ``step_bias``
      ``(n_heads,)``: the write strengths and log decays;
    - ``gate_proj`` (``d_model -> n_heads d_v``), ``norm`` (an RMSNorm of ``d_v``) and ``out_proj``
      (``n_heads d_v -> d_model``, reading the merged heads).

    ``mode`` (attribute; may be changed on a built layer): ``"gated"``, the gated delta rule
    (Qwen3-Next); ``"delta"``, the delta rule without decay (``decay_proj``, ``log_rate`` and
    ``step_bias`` unused); ``"linear"``, plain linear attention ``S_t = S_{t-1} + k_t v_t^T`` on the
    same queries, keys and values (``beta_proj`` unused too). Same parameters in every mode, so the
    three compare at equal size. ``chunk_size``: the blocks of the chunked form used for every call.

    ``init`` (:data:`DECAY_INITS`; None: ``"reference"``, or what :func:`decay_init` sets), the
    starting decay, drawn from torch's global generator:

    - ``"reference"``, Gated DeltaNet's reference (flash-linear-attention, as in Mamba-2): rates
      ``A ~ U(0, 16)``, ``log_rate = log(A)``; time steps ``dt = exp(U(log 1e-3, log 1e-1))``,
      at least ``1e-4``, and ``step_bias = dt + log(-expm1(-dt))``, the inverse of softplus, so
      that ``softplus(step_bias) = dt``. A head keeps ``exp(-A dt)`` of its state per token: a
      median of about 0.94 (:func:`keep_per_token`);
    - ``"transformers"``, a fresh ``transformers`` layer's: ``A ~ U(0.01, 16)``, ``step_bias = 1``,
      ``dt = softplus(1) = 1.31``: a median head keeps about ``e^-10`` per token.

    The two draw different numbers from the generator, so every weight built after the layer differs
    too.
    """

    part_role = "attention"  # see parts.py
    part_matrices = {
        "qkv": "in_proj.weight",
        "beta": "beta_proj.weight",
        "decay": "decay_proj.weight",
        "gate": "gate_proj.weight",
        "out": "out_proj.weight",
    }

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        *,
        n_qk_heads: int | None = None,
        d_k: int | None = None,
        d_v: int | None = None,
        conv_kernel: int = 4,
        mode: str = "gated",
        chunk_size: int = 64,
        eps: float = 1e-6,
        init: str | None = None,
    ):
        super().__init__()
        init = _default_init[0] if init is None else init
        _check_init(init)
        check_int(d_model, "d_model")
        check_int(n_heads, "n_heads")
        for name, value in (("n_qk_heads", n_qk_heads), ("d_k", d_k), ("d_v", d_v)):
            if value is not None:
                check_int(value, name)
        if d_k is None and d_model % n_heads:
            raise ValueError(
                f"d_model ({d_model}) is not divisible by n_heads ({n_heads}), so d_k has no default: give d_k"
            )
        n_qk_heads = n_heads if n_qk_heads is None else n_qk_heads
        if n_heads % n_qk_heads:
            raise ValueError(f"n_qk_heads ({n_qk_heads}) must divide n_heads ({n_heads})")
        check_int(conv_kernel, "conv_kernel")
        check_int(chunk_size, "chunk_size")
        _check_mode(mode)
        d_k = d_model // n_heads if d_k is None else d_k
        d_v = d_k if d_v is None else d_v
        self.d_model, self.n_heads, self.n_qk_heads, self.d_k, self.d_v = d_model, n_heads, n_qk_heads, d_k, d_v
        self.conv_kernel, self.mode, self.chunk_size, self.dropout = conv_kernel, mode, chunk_size, 0.0
        self.channels = 2 * n_qk_heads * d_k + n_heads * d_v
        self.in_proj = nn.Linear(d_model, self.channels, bias=False)
        self.conv = nn.Conv1d(self.channels, self.channels, conv_kernel, groups=self.channels, bias=False)
        self.beta_proj = nn.Linear(d_model, n_heads, bias=False)
        self.decay_proj = nn.Linear(d_model, n_heads, bias=False)
        self.log_rate, self.step_bias = (nn.Parameter(p) for p in _decay_start(n_heads, init))
        self.init = init
        self.gate_proj = nn.Linear(d_model, n_heads * d_v, bias=False)
        self.norm = RMSNorm(d_v, eps=eps)
        self.out_proj = nn.Linear(n_heads * d_v, d_model, bias=False)

    def new_cache(self, window: int | None = None) -> RecurrentState:
        """An empty :class:`RecurrentState` (``window`` must be None: a recurrence has no window)."""
        _refuse_window(window)
        return RecurrentState()

    def _inputs(self, x: Tensor, cache: RecurrentState | None):
        """``x (B, T, d_model)`` -> ``q, k (B, h, T, d_k)`` (unit, heads shared out), ``v (B, h, T, d_v)``,
        ``beta``, ``g (B, h, T)``, and the convolution's last inputs ``(B, channels, kernel - 1)``."""
        B, T, _ = x.shape
        qkv = self.in_proj(x).transpose(1, 2)  # (B, channels, T)
        before = cache.conv if cache is not None and cache.filled else qkv.new_zeros(B, self.channels, 0)
        padded = torch.cat([qkv.new_zeros(B, self.channels, self.conv_kernel - 1 - before.shape[2]), before, qkv], 2)
        qkv = F.silu(self.conv(padded)).transpose(1, 2)  # (B, T, channels): causal, each channel alone
        group, width = self.n_heads // self.n_qk_heads, self.n_qk_heads * self.d_k
        q, k, v = qkv.split((width, width, self.n_heads * self.d_v), dim=-1)
        q, k = (l2_normalize(t.reshape(B, T, -1, self.d_k)).transpose(1, 2).repeat_interleave(group, 1) for t in (q, k))
        v = v.reshape(B, T, self.n_heads, self.d_v).transpose(1, 2)  # (B, h, T, d_v)
        beta = torch.sigmoid(self.beta_proj(x)).transpose(1, 2)  # (B, h, T)
        g = (-self.log_rate.exp() * F.softplus(self.decay_proj(x) + self.step_bias)).transpose(1, 2)  # (B, h, T)
        return q, k, v, beta, g, padded[:, :, padded.shape[2] - (self.conv_kernel - 1) :]

    def _recurrence(self, q, k, v, beta, g, state):
        """The mode's recurrence: ``(heads (B, h, T, d_v), final state (B, h, d_k, d_v))``. Under autocast
        the decay comes out of ``softplus`` in float32 and the rest in 16 bits: all go in as ``v``'s dtype
        (a 16-bit recurrence runs in float32 and keeps a float32 state)."""
        q, k, beta, g = (t.to(v.dtype) for t in (q, k, beta, g))
        form = dict(form="chunked", chunk_size=self.chunk_size, initial_state=state)
        if self.mode == "linear":
            return linear_attention(q * self.d_k**-0.5, k, v, **form)
        return delta_rule(q, k, v, beta, gate=g if self.mode == "gated" else None, **form)

    def _weights(self, q, k, beta, g) -> Tensor:
        """The matrix ``(B, h, T, T)`` with ``heads == weights @ v`` from an empty state (at least float32)."""
        work = torch.promote_types(q.dtype, torch.float32)
        q, k, beta, g = (t.to(work) for t in (q, k, beta, g))
        if self.mode == "linear":
            return linear_attention_weights(q * self.d_k**-0.5, k)
        return delta_rule_weights(q, k, beta, gate=g if self.mode == "gated" else None)

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        *,
        mask: Tensor | None = None,
        need_weights: bool = False,
        is_causal: bool = True,
        window: int | None = None,
        cache: RecurrentState | None = None,
        _checked: bool = False,
        _trusted: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """``query (B, T, d_model)``, the same tensor as ``key`` and ``value`` -> ``(output (B, T, d_model),
        weights (B, h, T, T) or None)``.

        The signature of :meth:`MultiHeadAttention.forward`, for a :class:`DecoderLayer`; ``is_causal``
        must be True and ``mask`` and ``window`` None (a recurrence is causal, has no matrix to mask and
        no window). ``cache`` (a :class:`RecurrentState`): ``query`` holds the tokens after the
        ``cache.position`` already seen, whose state it starts from and then updates. ``need_weights``:
        the matrix that mixes the (convolved) values of each head, ``heads == weights @ v`` (the
        recurrence never forms it: :func:`~transformer_lib.linear_attention.delta_rule_weights`);
        only from an empty cache, where it is the whole story.
        """
        _check_call(mask, is_causal, window)
        if not _trusted:
            self._check_inputs(query, key, value, cache)
        if need_weights and cache is not None and cache.filled:
            raise ValueError(
                "need_weights=True needs an empty cache: the state already holds earlier tokens, "
                "which no matrix over the new ones shows"
            )
        _check_mode(self.mode)
        record = self._recording(cache)
        B, T, _ = query.shape
        shapes = (B, self.n_heads, self.d_k, self.d_v), (B, self.channels, self.conv_kernel - 1)
        if cache is not None:
            cache.check(*shapes)
        if T == 0:  # no token: an empty output, as multi-head attention gives, and the state as it was
            if record:
                self._report_scores(lambda: (None, query.new_zeros(B, self.n_heads, 0, 0)))
            weights = query.new_zeros(B, self.n_heads, 0, 0) if need_weights else None
            return query.new_zeros(B, 0, self.out_proj.out_features), weights
        q, k, v, beta, g, conv = self._inputs(query, cache)
        if record:  # no logits: a recurrence has no softmax
            self._report_scores(lambda: (None, self._weights(q, k, beta, g)))
        if cache is not None:  # a 16-bit layer (or autocast) keeps a float32 state
            cache.check(*shapes, torch.promote_types(v.dtype, torch.float32), conv.dtype)
        heads, state = self._recurrence(q, k, v, beta, g, None if cache is None else cache.state)
        if cache is not None:
            cache.update(state, conv, T)
        z = self.gate_proj(query).view(B, T, self.n_heads, self.d_v)
        out = self.norm(heads.transpose(1, 2)) * F.silu(z)  # (B, T, h, d_v)
        weights = self._weights(q, k, beta, g) if need_weights else None
        return self.out_proj(out.reshape(B, T, -1)), weights  # (B, T, d_model)

    def attention_weights(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        *,
        mask: Tensor | None = None,
        is_causal: bool = True,
        window: int | None = None,
        **_,
    ) -> Tensor:
        """The weights ``(B, h, T, T)`` of ``forward(query, key, value, need_weights=True)``: each row
        mixes the convolved values, lower triangular; not a softmax's, so a row need not sum to 1 nor be
        positive, and :meth:`record_scores` gives them with ``logits=None``: a recurrence scores none."""
        _check_call(mask, is_causal, window)
        self._check_inputs(query, key, value, None)
        _check_mode(self.mode)
        if query.shape[1] == 0:  # no token: no weights, as forward gives
            return query.new_zeros(query.shape[0], self.n_heads, 0, 0)
        q, k, _, beta, g, _ = self._inputs(query, None)
        return self._weights(q, k, beta, g)

    def _check_inputs(self, query, key, value, cache) -> None:
        """Self-attention, shape and dtype, the cache's type."""
        if key is not query or value is not query:
            raise ValueError("GatedDeltaNet is self-attention only: pass one tensor as query, key and value")
        check_float_tensors({"query": query}, layer_dtype=self.in_proj.weight.dtype)
        if query.dim() != 3 or query.shape[-1] != self.d_model:
            raise ValueError(f"query must have shape (B, T, d_model={self.d_model}), got {tuple(query.shape)}")
        if cache is not None and not isinstance(cache, RecurrentState):
            raise TypeError(f"cache must be a RecurrentState (layer.new_cache()) or None, got {type(cache).__name__}")

    def extra_repr(self) -> str:
        return (
            f"d_model={self.d_model}, n_heads={self.n_heads}, n_qk_heads={self.n_qk_heads}, d_k={self.d_k}, "
            f"d_v={self.d_v}, conv_kernel={self.conv_kernel}, mode={self.mode!r}"
        )


def _decay_start(n_heads: int, init: str) -> tuple[Tensor, Tensor]:
    """``(log_rate, step_bias)``, each ``(n_heads,)``, as ``init`` draws them (see GatedDeltaNet)."""
    if init == "transformers":
        return torch.empty(n_heads).uniform_(0.01, 16).log(), torch.ones(n_heads)  # rates in [0.01, 16]
    rate = torch.empty(n_heads).uniform_(0, 16)  # (n_heads,)
    low, high = map(math.log, STEP_RANGE)
    dt = torch.exp(torch.rand(n_heads) * (high - low) + low).clamp(min=STEP_FLOOR)  # (n_heads,)
    return rate.log(), dt + torch.log(-torch.expm1(-dt))  # softplus(step_bias) = dt


def _check_init(init) -> None:
    if init not in DECAY_INITS:
        raise ValueError(f"init must be one of {DECAY_INITS}, got {init!r}")


def _check_mode(mode) -> None:
    if mode not in DELTA_MODES:
        raise ValueError(f"mode must be one of {DELTA_MODES}, got {mode!r}")


def _refuse_window(window) -> None:
    if window is not None:
        raise ValueError(
            f"GatedDeltaNet has no sliding window (its state holds a summary of every token), "
            f"got window={window!r}: build the layer without one"
        )


def _check_call(mask, is_causal, window) -> None:
    """What a recurrence cannot do, refused by name even for a trusted caller."""
    if mask is not None:
        raise ValueError(
            "GatedDeltaNet takes no mask: the recurrence forms no attention matrix to mask (pad on the "
            "left, or run each sequence alone)"
        )
    if is_causal is not True:
        raise ValueError(
            f"GatedDeltaNet is causal by construction (a recurrence): is_causal must be True, got {is_causal!r}"
        )
    _refuse_window(window)


_RULES = {"linear": "linear", "delta": "delta", "gated_delta": "gated"}  # a recurrence's name -> its mode


@dataclass(frozen=True)
class RecurrenceSpec(Spec):
    """A recurrence in place of attention, as a recipe's choice (chapter "Attention as a recurrence"):
    Qwen3-Next's gated DeltaNet layer in the mode ``kind`` names, linear attention (``"linear"``), the
    delta rule (``"delta"``) or the gated delta rule (``"gated_delta"``); its state is the cache."""

    kind: str = option("gated_delta", "the recurrence: linear, delta or gated_delta", flat="attention")

    def __post_init__(self):
        super().__post_init__()
        if self.kind not in _RULES:
            raise ValueError(f"a recurrence's kind must be one of {list(_RULES)}, got {self.kind!r}")

    def layer(self, recipe, d_model: int, n_heads: int, *, n_kv_heads, dropout, self_attention) -> GatedDeltaNet:
        """One layer. It has no attention weights to drop: ``dropout`` is the residual's alone."""
        if not self_attention:
            raise ValueError(
                f"attention={self.kind!r} is a causal recurrence: an encoder-decoder's cross-attention is not"
            )
        if n_kv_heads is not None:
            raise ValueError(
                f"n_kv_heads={n_kv_heads} is grouped-query attention's: attention={self.kind!r} "
                "is a recurrence whose heads each keep a state"
            )
        return GatedDeltaNet(d_model, n_heads, mode=_RULES[self.kind], eps=recipe.norm_eps)
