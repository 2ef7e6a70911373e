"""A gated-DeltaNet GPT, or its hybrid, as Qwen3-Next (chapter "Attention as a recurrence").

The book's recipe ``"gated_delta"`` is Llama's block (chapter "Today's block") with Qwen3-Next's gated DeltaNet
(:class:`~transformer_lib.delta_net.GatedDeltaNet`) in every layer; with ``full_every`` every
``full_every``-th layer keeps multi-head attention (the recipe ``"hybrid"``). ``transformers``'
``Qwen3NextForCausalLM`` computes the same model with:

- **the layers' kinds** as ``layer_types``: ``"linear_attention"`` for a gated DeltaNet layer,
  ``"full_attention"`` for the book's multi-head ones, in the recipe's pattern;
- **a dense MLP in every layer** (``mlp_only_layers`` names them all): Qwen3-Next's MLP is the
  book's SwiGLU, and no expert is built;
- **zero-centred norms.** Qwen3-Next's RMSNorms multiply by ``1 + weight``: the book's weight
  ``w`` is written as ``w - 1`` (exact up to one rounding of the 1). The gated norm inside a
  DeltaNet layer multiplies by its weight, as the book's does;
- **the gated DeltaNet layer**: :func:`gated_delta_net_from_qwen3_next`
  read backwards (the book's maps fused per query-key head into ``in_proj_qkvz`` and
  ``in_proj_ba``);
- **the full-attention layers' output gate.** Qwen3-Next multiplies each head's output by
  ``sigmoid(gate)``, the gate a second half of ``q_proj`` per head. Its weights are zero, so the
  gate is exactly 0.5, and ``o_proj`` is the book's times 2 (exact: a power of two);
- **the rotary positions**: every dimension rotated (``partial_rotary_factor = 1``, Qwen3-Next's
  default a quarter), the frequencies with the recipe's base, rescaled as Llama's
  ``rope_parameters`` say where the recipe has a ``rope_scaling`` (chapter "Longer than trained",
  the Llama converter's); Qwen3-Next rotates dimension
  ``i`` with ``i + d_k / 2``, the book its neighbouring pairs, so the rows of each head of ``W_q``
  and ``W_k``, and the weights of the query and key norms, are reordered as for Llama
  (:func:`~transformer_lib.positional.half_split_rows`);
- **query-key norms.** Qwen3-Next normalises every full-attention layer's queries and keys: a
  hybrid is written only with ``qk_norm=True`` (the recipe ``"hybrid"``, without it, is refused
  by that setting).
- **at least one full-attention layer.** ``transformers``' Qwen3-Next counts the positions it has
  seen on its full-attention layers: with none (``full_every=0``) its forward fails, so such a GPT
  is refused by ``full_every``.

A setting Qwen3-Next cannot write is refused by name (``pretrained_llama.check_settings``): the
recurrences ``"linear"`` and ``"delta"`` (Qwen3-Next's layer always decays), biases, a window,
experts. ``transformers`` is imported only when called.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .delta_net import GatedDeltaNet
from .models import GPT
from .parts import find_parts
from .positional import half_split_rows
from .pretrained_llama import (
    _LLAMA_NORMS,
    ANY,
    SETTINGS,
    _layer_names,
    _llama_rope_parameters,
    check_convertible,
    check_settings,
)
from .recipe import LLAMA_BLOCK

__all__ = ["QWEN3_NEXT_SETTINGS", "gated_delta_net_from_qwen3_next", "qwen3_next_from_gpt"]

# What Qwen3-Next's format writes of each setting (check_settings): Llama's block with the gated delta
# rule, any widths, any pattern of full-attention layers (those with query-key norms: checked apart).
_QWEN3_NEXT_ANY = (
    *("n_kv_heads", "norm_eps", "activation", "d_ff", "rotary_base", "tie_embeddings", "qk_norm"),
    "rope_scaling",
)
QWEN3_NEXT_SETTINGS = (
    {name: LLAMA_BLOCK.flat().get(name) for name in SETTINGS}
    | dict.fromkeys((*_QWEN3_NEXT_ANY, "full_every"), ANY)
    | {"attention": "gated_delta"}
)
_WHY = {"attention": "Qwen3-Next's linear-attention layer is the gated delta rule, which always decays its state"}


def _zero_centred(weight: Tensor) -> Tensor:
    """An RMSNorm's weight as Qwen3-Next holds it: it multiplies by ``1 + weight``."""
    return weight - 1


def _delta_net_state(layer: GatedDeltaNet, book: dict[str, Tensor], prefix: str) -> dict[str, Tensor]:
    """The tensors of a ``Qwen3NextGatedDeltaNet`` (after ``linear_attn.``) computing ``layer``,
    whose own tensors are ``book[prefix + name]``: the reverse of ``gated_delta_net_from_qwen3_next``."""
    n_qk, d_k, D = layer.n_qk_heads, layer.d_k, layer.d_model
    group = layer.n_heads // n_qk  # value heads per query-key head
    q, k, v = book[prefix + "in_proj.weight"].split([n_qk * d_k, n_qk * d_k, layer.n_heads * layer.d_v])
    z = book[prefix + "gate_proj.weight"]
    qkvz = [t.reshape(n_qk, -1, D) for t in (q, k, v, z)]  # (n_qk, d_k or group d_v, D): rows by query-key head
    names = ("beta_proj.weight", "decay_proj.weight")
    ba = [book[prefix + n].reshape(n_qk, group, D) for n in names]  # (n_qk, group, D) each
    return {
        # (n_qk, 2 d_k + 2 group d_v, D) -> (rows, D): each query-key head's q, k, v, z side by side
        "in_proj_qkvz.weight": torch.cat(qkvz, dim=1).reshape(-1, D),
        "in_proj_ba.weight": torch.cat(ba, dim=1).reshape(-1, D),  # (n_qk, 2 group, D) -> (2 n_heads, D)
        "conv1d.weight": book[prefix + "conv.weight"],
        "A_log": book[prefix + "log_rate"],
        "dt_bias": book[prefix + "step_bias"],
        "norm.weight": book[prefix + "norm.weight"],
        "out_proj.weight": book[prefix + "out_proj.weight"],
    }


def qwen3_next_from_gpt(gpt: GPT) -> nn.Module:
    """A ``transformers`` ``Qwen3NextForCausalLM`` with the weights of a gated-DeltaNet :class:`GPT`
    or its hybrid (chapter "Attention as a recurrence"), every layer's MLP dense, mapping ``input_ids (B, T)`` to the
    GPT's logits ``(B, T, vocab_size)``.

    The GPT needs Llama's block (RMSNorm, SwiGLU, rotary positions, no biases) with
    ``attention="gated_delta"`` and ``full_every > 0``, its multi-head layers ``qk_norm=True``
    (Qwen3-Next always normalises their queries and keys). Anything else raises a ``ValueError``
    naming the setting. The model is in the GPT's dtype, in eval mode, with eager attention.
    """
    check_convertible(gpt, "qwen3_next_from_gpt", "Qwen3-Next")
    c = gpt.config
    check_settings(c, QWEN3_NEXT_SETTINGS, "Qwen3-Next's format", _WHY)
    if not c.full_every:
        raise ValueError(
            "Qwen3-Next's format needs full_every=N with N > 0, the GPT has full_every=0: transformers' Qwen3-Next "
            "counts the positions it has seen on its full-attention layers, and fails with none"
        )
    if not c.qk_norm:
        raise ValueError(
            f"Qwen3-Next's format needs qk_norm=True, the GPT has qk_norm=False: Qwen3-Next normalises the "
            f"queries and keys of its full-attention layers (the GPT's every {c.full_every}th)"
        )
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    book = gpt.state_dict()
    d_k, n_kv = c.d_model // c.n_heads, c.n_kv_heads or c.n_heads
    parts = [next(iter(find_parts(layer, "attention").items())) for layer in gpt.decoder.layers]
    recurrent = [layer for _, layer in parts if isinstance(layer, GatedDeltaNet)]
    # the widths as the layers hold them (a model without one: the recipe's)
    delta = recurrent[0] if recurrent else GatedDeltaNet(c.d_model, c.n_heads)
    d_ff = book[_layer_names(gpt, 0)["feed_forward", "in"]].shape[0] if c.n_layers else c.d_ff or 1
    cfg = Qwen3NextConfig(
        vocab_size=c.vocab_size,
        hidden_size=c.d_model,
        intermediate_size=d_ff,
        num_hidden_layers=c.n_layers,
        num_attention_heads=c.n_heads,
        num_key_value_heads=n_kv,
        head_dim=d_k,
        layer_types=[
            "linear_attention" if isinstance(layer, GatedDeltaNet) else "full_attention" for _, layer in parts
        ],
        mlp_only_layers=list(range(c.n_layers)),  # a dense MLP everywhere: no expert is built
        linear_num_key_heads=delta.n_qk_heads,
        linear_num_value_heads=delta.n_heads,
        linear_key_head_dim=delta.d_k,
        linear_value_head_dim=delta.d_v,
        linear_conv_kernel_dim=delta.conv_kernel,
        rope_parameters=_llama_rope_parameters(c) | {"partial_rotary_factor": 1.0},
        partial_rotary_factor=1.0,  # every dimension rotated, as the book does
        max_position_embeddings=c.context_len,
        rms_norm_eps=c.norm_eps,
        hidden_act="silu",
        attention_bias=False,
        tie_word_embeddings=c.tie_embeddings,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
        attn_implementation="eager",
    )
    q_back, k_back = torch.argsort(half_split_rows(c.n_heads, d_k)), torch.argsort(half_split_rows(n_kv, d_k))
    head_back = torch.argsort(half_split_rows(1, d_k))  # a query or key norm's weights, in Qwen3-Next's order
    state = {
        "model.embed_tokens.weight": book["tok_embed.weight"],
        "model.norm.weight": _zero_centred(book["decoder.norm.weight"]),
        "lm_head.weight": book["lm_head.weight"],
    }
    for i, (name, layer) in enumerate(parts):
        hf, names, prefix = f"model.layers.{i}.", _layer_names(gpt, i), f"decoder.layers.{i}.{name}."
        if isinstance(layer, GatedDeltaNet):
            state |= {hf + "linear_attn." + k: v for k, v in _delta_net_state(layer, book, prefix).items()}
        else:
            q, k, v = book[names["attention", "qkv"]].split([c.d_model, n_kv * d_k, n_kv * d_k])
            q = q[q_back].reshape(c.n_heads, d_k, c.d_model)  # (h d_k, d) -> (h, d_k, d)
            gated_q = torch.cat([q, torch.zeros_like(q)], dim=1)  # each head's query, then its gate's zero rows
            norm = prefix + "qk_transform.{}_norm.weight"
            state |= {
                hf + "self_attn.q_proj.weight": gated_q.reshape(-1, c.d_model),  # (h, 2 d_k, d) -> (2 h d_k, d)
                hf + "self_attn.k_proj.weight": k[k_back],
                hf + "self_attn.v_proj.weight": v,
                hf + "self_attn.o_proj.weight": 2 * book[names["attention", "out"]],  # sigmoid(0) = 1/2, undone
                hf + "self_attn.q_norm.weight": _zero_centred(book[norm.format("q")][head_back]),
                hf + "self_attn.k_norm.weight": _zero_centred(book[norm.format("k")][head_back]),
            }
        block_norms = [n for n in names["norms"] if not n.startswith(prefix)]  # the two around the sublayers
        state |= {
            hf + theirs: _zero_centred(book[ours]) for ours, theirs in zip(block_norms, _LLAMA_NORMS, strict=True)
        }
        state |= {
            hf + f"mlp.{theirs}.weight": book[names["feed_forward", role]]
            for role, theirs in (("gate", "gate_proj"), ("in", "up_proj"), ("out", "down_proj"))
        }
    model = Qwen3NextForCausalLM(cfg).to(book["tok_embed.weight"].dtype)
    model.load_state_dict({k: v.contiguous() for k, v in state.items()}, strict=not c.tie_embeddings)
    return model.eval()


def gated_delta_net_from_qwen3_next(layer: nn.Module) -> GatedDeltaNet:
    """A :class:`GatedDeltaNet` with the weights of a ``transformers`` ``Qwen3NextGatedDeltaNet`` (chapter "Attention as
    a recurrence").

    Qwen3-Next fuses its maps per query-key head: ``in_proj_qkvz`` gives, for each of the
    ``n_qk_heads`` groups, that group's query, key, values and output gates ``z`` side by side, and
    ``in_proj_ba`` its betas then its decay inputs ``a``. Their rows are sorted here into the
    book's maps (``in_proj``: all queries, all keys, all values); ``A_log`` is ``log_rate``,
    ``dt_bias`` is ``step_bias``; the convolution, the gated norm and ``out_proj`` are copied as they are.
    """
    if type(layer).__name__ != "Qwen3NextGatedDeltaNet":
        raise TypeError(f"layer must be a transformers Qwen3NextGatedDeltaNet, got {type(layer).__name__}")
    if layer.activation != "silu" or layer.conv1d.bias is not None:
        raise ValueError(
            f"gated_delta_net_from_qwen3_next follows a SiLU convolution without bias, got "
            f"hidden_act={layer.activation!r}, bias={layer.conv1d.bias is not None}"
        )
    w = layer.in_proj_qkvz.weight
    new = GatedDeltaNet(
        layer.hidden_size,
        layer.num_v_heads,
        n_qk_heads=layer.num_k_heads,
        d_k=layer.head_k_dim,
        d_v=layer.head_v_dim,
        conv_kernel=layer.conv_kernel_size,
        eps=layer.norm.variance_epsilon,
    ).to(device=w.device, dtype=w.dtype)
    n_qk, d_k, group_v = layer.num_k_heads, layer.head_k_dim, layer.head_v_dim * layer.num_v_heads // layer.num_k_heads
    q, k, v, z = (
        t.reshape(-1, w.shape[1]) for t in w.view(n_qk, -1, w.shape[1]).split([d_k, d_k, group_v, group_v], 1)
    )
    ba = layer.in_proj_ba.weight
    b, a = (t.reshape(-1, ba.shape[1]) for t in ba.view(n_qk, 2, -1, ba.shape[1]).unbind(1))
    with torch.no_grad():
        for mine, theirs in (
            (new.in_proj.weight, torch.cat([q, k, v])),
            (new.gate_proj.weight, z),
            (new.beta_proj.weight, b),
            (new.decay_proj.weight, a),
            (new.conv.weight, layer.conv1d.weight),
            (new.log_rate, layer.A_log),
            (new.step_bias, layer.dt_bias),
            (new.norm.weight, layer.norm.weight),
            (new.out_proj.weight, layer.out_proj.weight),
        ):
            mine.copy_(theirs)
    return new
