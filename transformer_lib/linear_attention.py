"""Attention as a recurrence (chapter "Attention as a recurrence"): linear attention and the delta rule, in three forms.

Drop the softmax and causal attention becomes a running sum. With ``S_t = sum_{s<=t} k_s v_s^T``, a
``d_k x d_v`` matrix per head, the output ``o_t = sum_{s<=t} (q_t . k_s) v_s`` is ``S_t^T q_t``: a
state of fixed size replaces the growing key-value cache. Every function here computes one causal
recurrence three ways, equal up to rounding:

- ``"parallel"``: the whole sequence at once, as masked attention without the softmax (``T x T``);
- ``"recurrent"``: one position at a time, updating the state (what decoding does);
- ``"chunked"``: blocks of ``chunk_size`` positions, parallel inside a block, the state carried
  from block to block (what training does on long sequences).

They are equal for finite inputs. A NaN or inf in one position's key or value reaches different
outputs in each form: the recurrence carries it forward only, the chunked form from the start of
its block on, the parallel form to every position, since a masked-out weight of 0 times NaN is
still NaN (as in :class:`~transformer_lib.multihead.MultiHeadAttention`): clean the inputs,
masking does not.

The recurrences, per head (``g_t <= 0`` a log decay, ``beta_t`` in (0, 1) a write strength):

- linear attention: ``S_t = exp(g_t) S_{t-1} + k_t v_t^T`` (no gate: ``g_t = 0``);
- the delta rule: ``S_t = S' + beta_t k_t (v_t - S'^T k_t)^T`` with ``S' = exp(g_t) S_{t-1}``: it
  writes only the part of ``v_t`` that the state does not already give for ``k_t``. With a gate
  this is the gated delta rule of Gated DeltaNet (Qwen3-Next's linear layers).

The mistake of plain linear attention: nothing is ever removed, so ``S_t`` grows without bound
(linearly in ``t`` for positive features and values of one sign) and with it the outputs. The
classic fix (Katharopoulos et al., 2020) divides ``o_t`` by ``q_t . z_t``, ``z_t = sum_{s<=t} k_s``,
making each output a weighted mean of the values. The delta rule fixes it otherwise: with unit keys
a write replaces what the state holds for that key instead of adding to it, and the gate forgets.

Shapes: ``q, k (B, h, T, d_k)``, ``v (B, h, T, d_v)``, ``beta`` and ``gate`` ``(B, h, T)``, the state
``(B, h, d_k, d_v)``. Inputs in bfloat16 or float16 are computed in float32: the output comes back in
their dtype, the state in float32 (and a float32 state may start a 16-bit call). The layers that use
these are in :mod:`transformer_lib.delta_net`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from ._checks import check_bool, check_float_tensors, check_int, check_temperature

__all__ = [
    "RECURRENT_FORMS",
    "delta_rule",
    "delta_rule_weights",
    "elu_feature_map",
    "l2_normalize",
    "linear_attention",
    "linear_attention_weights",
]

RECURRENT_FORMS = ("parallel", "recurrent", "chunked")


def l2_normalize(x: Tensor, eps: float = 1e-6) -> Tensor:
    """``x (..., d)`` -> ``(..., d)``: each vector divided by ``sqrt(|x|^2 + eps)`` (chapter "Attention as a
    recurrence"), as Qwen3-Next and the flash-linear-attention kernels normalise queries and keys (unit keys keep the
    delta rule's update a contraction)."""
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + eps)


def elu_feature_map(x: Tensor) -> Tensor:
    """``elu(x) + 1`` (chapter "Attention as a recurrence"): the positive feature map of Katharopoulos et al. (2020);
    any shape in, the same shape out. Positive features make ``q . z`` positive, so normalised linear
    attention is a weighted mean of the values."""
    return F.elu(x) + 1


def _check(q, k, v, extra: dict, form: str, chunk_size: int, initial_state, width: int | None = None) -> None:
    """The checks of the public functions: tensors of one dtype, shapes that fit, a known form."""
    tensors = {"q": q, "k": k, "v": v} | {name: t for name, t in extra.items() if t is not None}
    check_float_tensors(tensors)
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(
            f"q, k and v must have shape (B, h, T, d), got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    if k.shape != q.shape or v.shape[:3] != q.shape[:3]:
        raise ValueError(
            f"q and k must have one shape (B, h, T, d_k) and v (B, h, T, d_v), got {tuple(q.shape)}, "
            f"{tuple(k.shape)}, {tuple(v.shape)}"
        )
    for name, t in extra.items():
        if t is not None and t.shape != q.shape[:3]:
            raise ValueError(f"{name} must have shape (B, h, T) = {tuple(q.shape[:3])}, got {tuple(t.shape)}")
    if form not in RECURRENT_FORMS:
        raise ValueError(f"form must be one of {RECURRENT_FORMS}, got {form!r}")
    check_int(chunk_size, "chunk_size")
    if initial_state is not None:
        check_float_tensors({"initial_state": initial_state})
        if initial_state.dtype not in (q.dtype, _work_dtype(q.dtype)):
            raise TypeError(
                f"initial_state must have q's dtype {q.dtype} (or float32 for 16-bit q: the state a "
                f"16-bit call returns), got {initial_state.dtype}"
            )
        want = (*q.shape[:2], q.shape[-1], v.shape[-1] if width is None else width)
        if initial_state.shape != want:
            raise ValueError(
                f"initial_state must have shape (B, h, d_k, d_v) = {want}, got {tuple(initial_state.shape)}"
            )


def _parts(q: Tensor, k: Tensor, beta: Tensor | None, g: Tensor | None):
    """What a block of ``C`` positions needs: the causal decayed scores ``q_i . k_j exp(G_i - G_j)``
    ``(B, h, C, C)`` (zero above the diagonal), the cumulative log decay ``G (B, h, C)`` (None without
    a gate) and, for the delta rule, the unit lower-triangular system ``(B, h, C, C)`` of the writes."""
    C = q.shape[2]
    lower = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    if g is None:
        G, decay = None, lower.to(q.dtype)
    else:
        G = g.cumsum(-1)  # log of the decay from the block's start to each position
        decay = (G[..., :, None] - G[..., None, :]).masked_fill(~lower, float("-inf")).exp()  # exp(G_i - G_j)
    scores = (q @ k.transpose(-1, -2)) * decay  # (B, h, C, C)
    if beta is None:
        return scores, G, None
    A = ((k * beta[..., None]) @ k.transpose(-1, -2) * decay).tril(-1)  # beta_i exp(G_i - G_j) k_i . k_j, j < i
    return scores, G, A + torch.eye(C, dtype=q.dtype, device=q.device)


def _block(q: Tensor, k: Tensor, v: Tensor, state: Tensor, beta: Tensor | None, g: Tensor | None):
    """One block from ``state (B, h, d_k, d_v)`` -> ``(out (B, h, C, d_v), state after the block)``.

    The state after position ``i`` of the block is ``exp(G_i) S_0 + sum_{j<=i} exp(G_i - G_j) k_j u_j^T``
    where ``u_j`` is what position ``j`` writes: ``v_j`` for linear attention; for the delta rule
    ``beta_j (v_j - S'_j^T k_j)``, which depends on the earlier writes of the block. Those ``C``
    equations form one unit lower-triangular system (the "UT transform" of DeltaNet's chunked form):
    ``(I + A) U = beta V - beta exp(G) K S_0``, solved at once instead of step by step."""
    scores, G, system = _parts(q, k, beta, g)
    gain = None if G is None else G.exp()[..., None]  # (B, h, C, 1): the decay since the block's start
    if system is None:
        u = v
    else:
        kb = k * beta[..., None]
        rhs = v * beta[..., None] - (kb if gain is None else kb * gain) @ state  # (B, h, C, d_v)
        u = torch.linalg.solve_triangular(system, rhs, upper=False, unitriangular=True)
    out = (q if gain is None else q * gain) @ state + scores @ u  # the old state read, then the block's writes
    if G is None:
        return out, state + k.transpose(-1, -2) @ u
    last = G[..., -1:]  # (B, h, 1)
    k_kept = k * (last - G).exp()[..., None]  # each write decayed to the block's end
    return out, state * last.exp()[..., None] + k_kept.transpose(-1, -2) @ u


def _recurrent(q: Tensor, k: Tensor, v: Tensor, state: Tensor, beta: Tensor | None, g: Tensor | None):
    """The recurrence one position at a time: ``(out (B, h, T, d_v), final state)``."""
    outs = []
    for t in range(q.shape[2]):
        if g is not None:
            state = state * g[:, :, t, None, None].exp()  # forget
        k_t, v_t = k[:, :, t], v[:, :, t]  # (B, h, d_k), (B, h, d_v)
        if beta is not None:  # the delta rule: write only what the state gets wrong for k_t
            v_t = beta[:, :, t, None] * (v_t - (state * k_t[..., None]).sum(-2))
        state = state + k_t[..., None] * v_t[..., None, :]  # + k_t v_t^T
        outs.append((state * q[:, :, t, :, None]).sum(-2))  # S_t^T q_t
    return (torch.stack(outs, dim=2) if outs else v[:, :, :0]), state


def _work_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a recurrence runs in: float32 for 16-bit inputs (the decays' exponentials, the long sums
    and the triangular solve need its range and precision, as Qwen3-Next's kernels run), else the inputs'."""
    return torch.promote_types(dtype, torch.float32)


def _run(q, k, v, state, beta, g, form: str, chunk_size: int, scale: float = 1.0) -> tuple[Tensor, Tensor]:
    """The recurrence in ``form``, in :func:`_work_dtype` (``q`` scaled there): the output in ``q``'s dtype,
    the state in the work's."""
    dtype, work = q.dtype, _work_dtype(q.dtype)
    if work != dtype:
        q, k, v, state, beta, g = (None if t is None else t.to(work) for t in (q, k, v, state, beta, g))
    out, state = _run_in(q * scale if scale != 1.0 else q, k, v, state, beta, g, form, chunk_size)
    return out.to(dtype), state


def _run_in(q, k, v, state, beta, g, form: str, chunk_size: int) -> tuple[Tensor, Tensor]:
    if form == "recurrent":
        return _recurrent(q, k, v, state, beta, g)
    size = max(q.shape[2], 1) if form == "parallel" else chunk_size  # parallel: one block of all T
    outs = []
    for s in range(0, q.shape[2], size):
        part = slice(s, s + size)
        cut = lambda t: None if t is None else t[:, :, part]
        out, state = _block(q[:, :, part], k[:, :, part], v[:, :, part], state, cut(beta), cut(g))
        outs.append(out)
    return (torch.cat(outs, dim=2) if outs else v[:, :, :0]), state


def linear_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    form: str = "parallel",
    chunk_size: int = 64,
    feature_map: Callable[[Tensor], Tensor] | None = None,
    normalize: bool = False,
    gate: Tensor | None = None,
    initial_state: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Causal linear attention (chapter "Attention as a recurrence"): ``q, k (B, h, T, d_k)``, ``v (B, h, T, d_v)`` ->
    ``(out (B, h, T, d_v), final state (B, h, d_k, d_v))``.

    ``o_t = S_t^T q_t`` with ``S_t = exp(g_t) S_{t-1} + k_t v_t^T``, from ``initial_state`` (zeros by
    default); no scale. ``form``: ``"parallel"`` (``(q k^T masked causally) v``), ``"recurrent"`` or
    ``"chunked"`` (blocks of ``chunk_size``). ``feature_map`` (e.g. :func:`elu_feature_map`) maps
    ``q`` and ``k`` first. ``gate (B, h, T)``: log decays ``g_t <= 0`` (None: no decay). ``normalize``:
    divide by ``q_t . z_t``, ``z_t`` the (decayed) sum of the keys; ``z`` is carried as one more value
    column of ones, so the state and ``initial_state`` are then ``(B, h, d_k, d_v + 1)``, ``z`` last.
    Normalise only with positive features: ``q_t . z_t`` near 0 divides by almost nothing.
    """
    if feature_map is not None and not callable(feature_map):
        raise TypeError(f"feature_map must be a function of a tensor or None, got {type(feature_map).__name__}")
    check_bool(normalize, "normalize")
    _check(q, k, v, {"gate": gate}, form, chunk_size, None)
    if feature_map is not None:
        q, k = feature_map(q), feature_map(k)
    if normalize:
        v = torch.cat([v, torch.ones_like(v[..., :1])], dim=-1)  # the last column of the state is z
    _check(q, k, v, {}, form, chunk_size, initial_state)
    state = initial_state if initial_state is not None else q.new_zeros(*q.shape[:2], q.shape[-1], v.shape[-1])
    out, state = _run(q, k, v, state, None, gate, form, chunk_size)
    return (out[..., :-1] / out[..., -1:] if normalize else out), state


def delta_rule(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor,
    *,
    gate: Tensor | None = None,
    form: str = "recurrent",
    chunk_size: int = 64,
    scale: float | None = None,
    initial_state: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """The (gated) delta rule (chapter "Attention as a recurrence"): ``q, k (B, h, T, d_k)``, ``v (B, h, T, d_v)``,
    ``beta (B, h, T)`` -> ``(out (B, h, T, d_v), final state (B, h, d_k, d_v))``.

    ``S' = exp(g_t) S_{t-1}``, ``S_t = S' + beta_t k_t (v_t - S'^T k_t)^T``, ``o_t = scale S_t^T q_t``,
    from ``initial_state`` (zeros by default). ``gate (B, h, T)``: the log decays ``g_t <= 0`` (None:
    plain DeltaNet); ``beta`` in (0, 1) is how much of the correction is written. ``scale``: default
    ``1 / sqrt(d_k)``. These are the conventions of transformers' ``torch_recurrent_gated_delta_rule``
    and ``torch_chunk_gated_delta_rule`` (Qwen3-Next), state ``(d_k, d_v)``, except that the keys and
    queries are not normalised here: pass unit keys (:func:`l2_normalize`), as their
    ``use_qk_l2norm_in_kernel=True`` does, or the update is no longer a contraction. ``form``:
    ``"recurrent"``, ``"chunked"`` (blocks of ``chunk_size``, each solved as one triangular system)
    or ``"parallel"`` (the whole sequence as one such block).
    """
    _check(q, k, v, {"beta": beta, "gate": gate}, form, chunk_size, initial_state)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    check_temperature(scale, "scale")
    state = initial_state if initial_state is not None else q.new_zeros(*q.shape[:2], q.shape[-1], v.shape[-1])
    return _run(q, k, v, state, beta, gate, form, chunk_size, scale)


def _check_weights_inputs(q: Tensor, k: Tensor, extra: dict) -> None:
    check_float_tensors({"q": q, "k": k} | {name: t for name, t in extra.items() if t is not None})
    if q.dim() != 4 or k.shape != q.shape:
        raise ValueError(f"q and k must have one shape (B, h, T, d_k), got {tuple(q.shape)} and {tuple(k.shape)}")
    for name, t in extra.items():
        if t is not None and t.shape != q.shape[:3]:
            raise ValueError(f"{name} must have shape (B, h, T) = {tuple(q.shape[:3])}, got {tuple(t.shape)}")


def linear_attention_weights(
    q: Tensor,
    k: Tensor,
    *,
    feature_map: Callable[[Tensor], Tensor] | None = None,
    normalize: bool = False,
    gate: Tensor | None = None,
) -> Tensor:
    """The attention matrix ``(B, h, T, T)`` that :func:`linear_attention` applies without forming it
    (chapter "Attention as a recurrence"): ``linear_attention(q, k, v, ...)[0] == weights @ v`` from a zero state. Entry
    ``(t, s)`` is ``phi(q_t) . phi(k_s) exp(g_{s+1} + ... + g_t)`` for ``s <= t``, 0 above the diagonal; with
    ``normalize`` each row is divided by its sum (a weighted mean for positive features)."""
    if feature_map is not None and not callable(feature_map):
        raise TypeError(f"feature_map must be a function of a tensor or None, got {type(feature_map).__name__}")
    check_bool(normalize, "normalize")
    _check_weights_inputs(q, k, {"gate": gate})
    if feature_map is not None:
        q, k = feature_map(q), feature_map(k)
    weights = _parts(q, k, None, gate)[0]
    return weights / weights.sum(-1, keepdim=True) if normalize else weights


def delta_rule_weights(
    q: Tensor, k: Tensor, beta: Tensor, *, gate: Tensor | None = None, scale: float | None = None
) -> Tensor:
    """The attention matrix ``(B, h, T, T)`` that :func:`delta_rule` applies without forming it (chapter "Attention as a
    recurrence"): ``delta_rule(q, k, v, beta, ...)[0] == weights @ v`` from a zero state, lower triangular. It is the
    decayed scores ``scale q_t . k_s exp(G_t - G_s)`` times ``(I + A)^-1 diag(beta)``, the inverse of the
    triangular system of the writes: each value enters through every later write that corrected it."""
    _check_weights_inputs(q, k, {"beta": beta, "gate": gate})
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    check_temperature(scale, "scale")
    scores, _, system = _parts(q * scale, k, beta, gate)
    return scores @ torch.linalg.solve_triangular(system, torch.diag_embed(beta), upper=False, unitriangular=True)
