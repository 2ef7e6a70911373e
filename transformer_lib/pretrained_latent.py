"""A GPT with latent attention as a dense DeepSeek-V3 (chapter "Latent, sparse and sink attention").

The book's recipe ``"latent"`` is Llama's block (chapter "Today's block") with DeepSeek-V3's multi-head latent
attention (:class:`~transformer_lib.latent_attention.LatentAttention`). ``transformers``'
``DeepseekV3ForCausalLM`` computes the same model once every layer keeps a dense feed-forward
network (``first_k_dense_replace = num_hidden_layers``: its ``DeepseekV3MLP`` is the book's SwiGLU):

- the widths: each head's query and key are ``qk_nope_head_dim = d_k`` numbers read from the
  latent and ``qk_rope_head_dim = rope_dim`` rotated ones, its value ``v_head_dim = d_k``; the
  latent is ``kv_lora_rank = kv_latent`` wide, the query's ``q_lora_rank = q_latent`` (None: a
  full query projection);
- the order within a head: the unrotated part first, then the rotated part, in both;
- the rotary pairs: DeepSeek's ``rope_interleave=True`` rotates the neighbouring pairs
  ``(2i, 2i + 1)``, the book's own convention, so no row is reordered;
- the scale of the scores: ``1 / sqrt(qk_nope_head_dim + qk_rope_head_dim)`` in both (no YaRN
  ``mscale``: the rotary frequencies are the default ones);
- the norms: RMSNorm on the latents (``kv_a_layernorm``, ``q_a_layernorm``) and around each
  sublayer. DeepSeek-V3 gives the latents' norms ``eps = 1e-6`` whatever its ``rms_norm_eps``, the
  book every norm the recipe's ``norm_eps``: only a GPT with ``norm_eps=1e-6`` is written (the
  recipe ``"latent"`` keeps Llama's 1e-5 and is refused by that setting).

This is :func:`latent_from_deepseek` (``interleaved=True``) read
backwards, for a whole model. A setting DeepSeek-V3's format cannot write is refused by name
(``pretrained_llama.check_settings``): biases (DeepSeek's ``attention_bias`` has no counterpart
in the feed-forward network and the norms), experts (the book's experts GPT uses multi-head
attention), a window, sinks. ``transformers`` is imported only when called.
"""

from __future__ import annotations

import torch
from torch import nn

from ._checks import check_bool
from .latent_attention import LatentAttention
from .models import GPT
from .parts import find_parts
from .positional import half_split_rows
from .pretrained_llama import (
    _LLAMA_MATRICES,
    _LLAMA_NORMS,
    ANY,
    SETTINGS,
    _layer_names,
    check_convertible,
    check_settings,
)
from .recipe import LLAMA_BLOCK
from .sparse_attention import Indexer

__all__ = ["deepseek_v3_from_gpt", "indexer_from_deepseek", "latent_from_deepseek"]

# What DeepSeek-V3's format writes of each setting: Llama's block with latent attention, its widths any.
_LATENT_ANY = ("activation", "d_ff", "rotary_base", "tie_embeddings", "kv_latent", "q_latent", "rope_dim")
DEEPSEEK_V3_SETTINGS = (
    {name: LLAMA_BLOCK.flat().get(name) for name in SETTINGS}
    | dict.fromkeys(_LATENT_ANY, ANY)
    | {"attention": "latent", "norm_eps": 1e-6}
)
_WHY = {
    "norm_eps": "DeepSeek-V3 normalises its latents (kv_a_layernorm, q_a_layernorm) with eps 1e-6 whatever "
    "rms_norm_eps says, and the book's latent attention with the recipe's norm_eps: train with "
    "norm_eps=1e-6 to export"
}
# The book's LatentAttention module -> DeepSeek-V3's (after "model.layers.i.self_attn.")
_LATENT_MODULES = {
    "q_proj": "q_proj",
    "q_down": "q_a_proj",
    "q_norm": "q_a_layernorm",
    "q_up": "q_b_proj",
    "kv_down": "kv_a_proj_with_mqa",
    "kv_norm": "kv_a_layernorm",
    "kv_up": "kv_b_proj",
    "out_proj": "o_proj",
}


def deepseek_v3_from_gpt(gpt: GPT) -> nn.Module:
    """A ``transformers`` ``DeepseekV3ForCausalLM`` with the weights of a latent-attention :class:`GPT`
    (chapter "Latent, sparse and sink attention"), every layer dense, mapping ``input_ids (B, T)`` to the GPT's logits
    ``(B, T, vocab_size)``.

    The GPT needs Llama's block (RMSNorm, SwiGLU, rotary positions, no biases) with
    ``attention="latent"`` and ``norm_eps=1e-6`` (the eps DeepSeek-V3's latent norms keep); its
    widths (``kv_latent``, ``q_latent``, ``rope_dim``) are written as they are. Anything else
    raises a ``ValueError`` naming the setting. The model is in the GPT's dtype, in eval mode,
    with eager attention.
    """
    check_convertible(gpt, "deepseek_v3_from_gpt", "DeepSeek-V3")
    c = gpt.config
    check_settings(c, DEEPSEEK_V3_SETTINGS, "DeepSeek-V3's format", _WHY)
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    book = gpt.state_dict()
    attentions = [next(iter(find_parts(layer, "attention").items())) for layer in gpt.decoder.layers]
    d_k = c.d_model // c.n_heads
    # the widths as the layers hold them (a model without layers: the recipe's defaults)
    first = (
        attentions[0][1]
        if attentions
        else LatentAttention(
            c.d_model, c.n_heads, kv_latent=c.kv_latent or 4 * d_k, q_latent=c.q_latent, rope_dim=c.rope_dim
        )
    )
    cfg = DeepseekV3Config(
        vocab_size=c.vocab_size,
        hidden_size=c.d_model,
        intermediate_size=book[_layer_names(gpt, 0)["feed_forward", "in"]].shape[0] if c.n_layers else c.d_ff or 1,
        num_hidden_layers=c.n_layers,
        num_attention_heads=c.n_heads,
        num_key_value_heads=c.n_heads,
        first_k_dense_replace=c.n_layers,  # every layer dense: no experts are built
        kv_lora_rank=first.kv_latent,
        q_lora_rank=first.q_latent,
        qk_rope_head_dim=first.rope_dim,
        qk_nope_head_dim=first.nope_dim,
        v_head_dim=first.v_dim,
        rope_interleave=True,  # the book's neighbouring pairs
        rope_parameters={"rope_type": "default", "rope_theta": float(c.rotary_base)},
        max_position_embeddings=c.context_len,
        rms_norm_eps=c.norm_eps,
        hidden_act="silu",
        attention_bias=False,
        tie_word_embeddings=c.tie_embeddings,
        bos_token_id=None,
        eos_token_id=None,
        attn_implementation="eager",
    )
    state = {
        "model.embed_tokens.weight": book["tok_embed.weight"],
        "model.norm.weight": book["decoder.norm.weight"],
        "lm_head.weight": book["lm_head.weight"],
    }
    for i, (part, _) in enumerate(attentions):
        hf, names = f"model.layers.{i}.", _layer_names(gpt, i)
        prefix = f"decoder.layers.{i}.{part}."
        for key, value in book.items():
            if key.startswith(prefix) and not key.startswith(prefix + "rotary"):
                module, _, leaf = key.removeprefix(prefix).partition(".")
                state[f"{hf}self_attn.{_LATENT_MODULES[module]}.{leaf}"] = value
        state |= {hf + theirs: book[names[key]] for key, theirs in _LLAMA_MATRICES.items() if key[0] != "attention"}
        norms = [n for n in names["norms"] if not n.startswith(prefix)]  # the block's two, not the latents'
        state |= {hf + theirs: book[ours] for ours, theirs in zip(norms, _LLAMA_NORMS, strict=True)}
    model = DeepseekV3ForCausalLM(cfg).to(book["tok_embed.weight"].dtype)
    model.load_state_dict({k: v.contiguous() for k, v in state.items()}, strict=not c.tie_embeddings)
    return model.eval()


def latent_from_deepseek(attn: nn.Module, *, interleaved: bool = True) -> LatentAttention:
    """A :class:`LatentAttention` with the weights of a ``transformers`` ``DeepseekV3Attention`` (chapter "Latent,
    sparse and sink attention").

    ``interleaved`` says how the source lays out its rotary rows: True for ``rope_interleave=True``
    (pairs ``(2i, 2i + 1)``, the book's own: copied as they are), False for half-split pairs
    ``(i, i + rope_dim / 2)``, whose rows of the query and of ``kv_down``'s rotary key are then
    reordered into pairs. The wrong choice loads without complaint and computes other scores.
    """
    if type(attn).__name__ != "DeepseekV3Attention":
        raise TypeError(f"attn must be a transformers DeepseekV3Attention, got {type(attn).__name__}")
    check_bool(interleaved, "interleaved")
    rope, n_kv = dict(attn.config.rope_parameters or {}), attn.config.num_key_value_heads
    if rope.get("rope_type", "default") != "default":
        raise ValueError(f"latent_from_deepseek follows plain rotary only, got rope_type={rope['rope_type']!r}")
    if n_kv != attn.num_heads:
        raise ValueError(
            f"num_key_value_heads ({n_kv}) must equal num_attention_heads "
            f"({attn.num_heads}): every head has its own key"
        )
    w = attn.kv_a_proj_with_mqa.weight
    new = LatentAttention(
        attn.hidden_size,
        attn.num_heads,
        kv_latent=attn.kv_lora_rank,
        q_latent=attn.q_lora_rank,
        rope_dim=attn.qk_rope_head_dim,
        nope_dim=attn.qk_nope_head_dim,
        v_dim=attn.v_head_dim,
        rotary_base=rope.get("rope_theta", 10000.0),
        eps=attn.kv_a_layernorm.variance_epsilon,
        dropout=float(attn.attention_dropout),
        bias=attn.kv_a_proj_with_mqa.bias is not None,
    ).to(device=w.device, dtype=w.dtype)
    r, L, width = new.rope_dim, new.kv_latent, new.nope_dim + new.rope_dim
    pairs = torch.arange(r) if interleaved else torch.arange(r).view(2, r // 2).t().reshape(-1)  # 0, r/2, 1, ...
    q_rows = torch.arange(new.n_heads)[:, None] * width + torch.cat([torch.arange(new.nope_dim), new.nope_dim + pairs])
    kv_rows = torch.cat([torch.arange(L), L + pairs])  # the latent's rows, then the rotary key's
    reorder = dict.fromkeys(("q_proj.weight", "q_up.weight"), q_rows.reshape(-1))  # per head: nope rows, rope rows
    reorder |= dict.fromkeys(("kv_down.weight", "kv_down.bias"), kv_rows)
    names = dict(
        q_proj="q_proj",
        q_down="q_a_proj",
        q_norm="q_a_layernorm",
        q_up="q_b_proj",
        out_proj="o_proj",
        kv_down="kv_a_proj_with_mqa",
        kv_norm="kv_a_layernorm",
        kv_up="kv_b_proj",
    )
    theirs = attn.state_dict()
    with torch.no_grad():
        for name, p in new.named_parameters():
            module, leaf = name.split(".")
            source = theirs[f"{names[module]}.{leaf}"]
            p.copy_(source[reorder[name]] if name in reorder else source)
    return new


@torch.no_grad()
def indexer_from_deepseek(indexer: nn.Module) -> Indexer:
    """An :class:`Indexer` with the weights of ``transformers``' ``DeepseekV32Indexer`` (chapter "Latent, sparse and
    sink attention").

    DeepSeek rotates the half-split pairs ``(i, i + r/2)`` of the first ``r`` dimensions of each
    head, the book neighbouring pairs, with the same frequencies: the rotated rows of the query
    heads and of the key (with its LayerNorm's weight and bias) are reordered, the others kept.
    Its queries read DeepSeek's query latent (``q_lora_rank`` wide): pass it as ``q_input``.
    """
    if type(indexer).__name__ != "DeepseekV32Indexer":
        raise TypeError(f"indexer must be a transformers DeepseekV32Indexer, got {type(indexer).__name__}")
    config = indexer.config
    r, D, H = indexer.qk_rope_head_dim, indexer.head_dim, indexer.n_heads
    rope = dict(getattr(config, "rope_parameters", None) or {})
    if rope.get("rope_type", "default") != "default":
        raise ValueError(f"only the default rotary frequencies can be copied, got rope_type={rope['rope_type']!r}")
    order = torch.cat([half_split_rows(1, r), torch.arange(r, D)])  # (D,): the rope rows reordered
    base = float(rope.get("rope_theta", 10000.0))
    ours = Indexer(config.hidden_size, H, D, rope_dim=r, q_dim=indexer.q_lora_rank, rotary_base=base)
    ours = ours.to(indexer.wk.weight.dtype)
    ours.q_proj.weight.copy_(indexer.wq_b.weight.view(H, D, -1)[:, order].reshape(H * D, -1))
    ours.k_proj.weight.copy_(indexer.wk.weight[order])
    ours.k_norm.weight.copy_(indexer.k_norm.weight[order])
    ours.k_norm.bias.copy_(indexer.k_norm.bias[order])
    ours.weights_proj.weight.copy_(indexer.weights_proj.weight)
    return ours.eval()
