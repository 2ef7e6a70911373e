"""A mixture of experts (chapter "Experts"): many feed-forward networks and a router that sends
each token to its top k of them, as Mixtral, Qwen3's MoE models and DeepSeek-V3 do.

:class:`ExpertsSpec` is the choice, a small frozen object that checks its own options and builds
the layer: a recipe that holds one (``BlockRecipe(ffn=ExpertsSpec(...))``) gives every layer
an :class:`Experts` network in place of its feed-forward network, except the first
``dense_layers`` (DeepSeek-V3's ``first_k_dense_replace``), which keep the dense one.

The pieces, one function each, so that the chapter can show and test them one at a time:

- :func:`route`: the router's scores (a softmax over the experts, or a sigmoid each), the choice
  (top k, optionally within the best groups, optionally moved by a bias), and the weights (the
  chosen scores, renormalised or not, times a scaling factor);
- :func:`combine_plainly` (a loop over tokens), :meth:`Experts.forward` (a loop over experts,
  the way ``transformers``' eager experts run) and :func:`combine_grouped` (the tokens sorted
  by expert into one buffer per expert, with a capacity past which tokens are dropped): the same
  output, three ways;
- the balancing terms: :func:`load_balancing_loss` (the Switch loss, in its conventions),
  :func:`router_z_loss`, and :meth:`Experts.after_step`, DeepSeek-V3's update of the bias that
  moves the choice and never the weights (auxiliary-loss-free balancing).

In training mode an :class:`Experts` layer keeps its weighted balancing terms in
``training_loss``; :class:`~transformer_lib.models.GPT` adds their mean over the layers to the
loss it returns when it is given targets in training mode, so that a balancing loss is never
computed and then forgotten. In eval mode the loss is the language model's alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ._checks import check_bool, check_int, is_real
from ._specs import FlatSpec, Spec
from .modern_block import SwiGLU, SwiGLUSpec, swiglu_hidden

__all__ = [
    "ExpertsSpec",
    "Experts",
    "Routing",
    "active_parameters",
    "combine_grouped",
    "combine_plainly",
    "expert_loads",
    "experts_layers",
    "load_balancing_loss",
    "route",
    "router_z_loss",
]

SCORES = ("softmax", "sigmoid")


def _option(default, help_: str):
    return field(default=default, metadata={"help": help_})


@dataclass(frozen=True)
class ExpertsSpec(Spec):
    """The choices of a mixture-of-experts feed-forward layer (chapter "Experts"); the defaults are
    a small Mixtral: eight experts, two per token, softmax scores renormalised over the two.

    Each field is also a flag of the training command (``n_experts`` is ``--experts``, the
    others ``--experts-<field>``), with the help written here.
    """

    n_experts: int = _option(8, "routed experts per layer (0: a dense feed-forward network)")
    top_k: int = _option(2, "experts each token is sent to")
    d_expert: int | None = _option(None, "each expert's hidden width (default: the recipe's d_ff, or SwiGLU's)")
    n_shared: int = _option(0, "shared experts every token passes through, beside the routed ones")
    score: str = _option("softmax", "the router's scores: softmax (over the experts) or sigmoid (each alone)")
    norm_topk: bool = _option(True, "divide the chosen experts' weights by their sum")
    n_groups: int = _option(1, "groups of experts; a token chooses within the best topk_groups (DeepSeek-V3)")
    topk_groups: int = _option(1, "groups a token may choose its experts from")
    scaling: float = _option(1.0, "the routed experts' weights are multiplied by this (routed_scaling_factor)")
    dense_layers: int = _option(0, "the first this many layers keep a dense feed-forward network")
    aux_loss: float = _option(0.01, "the weight of the load-balancing loss added to the training loss (0: none)")
    z_loss: float = _option(0.0, "the weight of the router z-loss added to the training loss (0: none)")
    bias_rate: float = _option(0.0, "each step, move each expert's choice bias by this towards balance (0: none)")
    capacity: float | None = _option(
        None, "capacity factor: in training an expert takes at most factor * k N / E tokens"
    )
    # the width of the first dense_layers' SwiGLU networks, and the experts' when d_expert is None
    d_ff: int | None = field(
        default=None,
        metadata={"help": "the feed-forward width (default: 4 d_model, or 2/3 of it for swiglu)", "flat": "d_ff"},
    )

    kind = "experts"  # its name among the recipe's feed-forward networks

    def __post_init__(self):
        super().__post_init__()
        check_int(self.n_experts, "n_experts")
        check_int(self.top_k, "top_k")
        if self.top_k > self.n_experts:
            raise ValueError(f"top_k={self.top_k} experts per token, but only n_experts={self.n_experts}")
        if self.d_expert is not None:
            check_int(self.d_expert, "d_expert")
        check_int(self.n_shared, "n_shared", minimum=0)
        if self.score not in SCORES:
            raise ValueError(f"score must be one of {list(SCORES)}, got {self.score!r}")
        check_bool(self.norm_topk, "norm_topk")
        check_int(self.n_groups, "n_groups")
        check_int(self.topk_groups, "topk_groups")
        if self.n_experts % self.n_groups:
            raise ValueError(f"n_groups={self.n_groups} must divide n_experts={self.n_experts}")
        if self.topk_groups > self.n_groups:
            raise ValueError(f"topk_groups={self.topk_groups} is more than n_groups={self.n_groups}")
        per_group = self.n_experts // self.n_groups
        if self.n_groups > 1 and per_group < 2:
            raise ValueError(f"a group is scored by its two best experts: n_experts / n_groups = {per_group}")
        if self.top_k > self.topk_groups * per_group:
            raise ValueError(
                f"top_k={self.top_k} experts cannot be found in topk_groups={self.topk_groups} groups of {per_group}"
            )
        check_int(self.dense_layers, "dense_layers", minimum=0)
        for name in ("scaling", "aux_loss", "z_loss", "bias_rate"):
            value = getattr(self, name)
            if isinstance(value, bool) or not is_real(value) or not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        if not self.scaling > 0:
            raise ValueError(f"scaling must be > 0 (it multiplies the experts' weights), got {self.scaling!r}")
        if self.capacity is not None:
            value = self.capacity
            if isinstance(value, bool) or not is_real(value) or not math.isfinite(value) or not value > 0:
                raise ValueError(f"capacity must be None (no token dropped) or a number > 0, got {value!r}")

    def layer(self, recipe, d_model: int, d_ff: int | None = None) -> Experts:
        """The layer of width ``d_model`` with the recipe's biases; ``d_ff`` (a layer's own) wins over
        the spec's, and either is the experts' width when ``d_expert`` is None."""
        return Experts(d_model, self, d_ff=self.d_ff if d_ff is None else d_ff, bias=recipe.bias)

    def for_layer(self, index: int):
        """This spec, or for one of the first ``dense_layers`` layers the dense SwiGLU network
        (DeepSeek-V3 keeps its first three dense)."""
        return SwiGLUSpec(d_ff=self.d_ff) if index < self.dense_layers else self


# The command line's flat settings: ``experts`` is n_experts (0: none), ``experts_<field>`` the others.
FLAT_SPEC = FlatSpec(ExpertsSpec, "experts", "n_experts", 0, "experts_")
FLAT, FLAT_HELP, FLAT_TYPES = FLAT_SPEC.names, FLAT_SPEC.help, FLAT_SPEC.types
spec_from_dict = FLAT_SPEC.from_value  # a spec from a spec, a checkpoint's dict or None
flat_settings = FLAT_SPEC.settings  # the spec (or None) as the flat settings
spec_from_flat = FLAT_SPEC.spec  # the spec the flat settings say (None: no experts)


class Routing(tuple):
    """What :func:`route` returns (chapter "Experts"): ``(weights (N, k), chosen (N, k), logits (N, E),
    scores (N, E))``."""

    __slots__ = ()

    def __new__(cls, weights, chosen, logits, scores):
        return super().__new__(cls, (weights, chosen, logits, scores))

    def __getnewargs__(self):  # copy.deepcopy and pickle rebuild it from its four parts
        return tuple(self)

    weights = property(lambda self: self[0])
    chosen = property(lambda self: self[1])
    logits = property(lambda self: self[2])
    scores = property(lambda self: self[3])


def route(logits: Tensor, spec: ExpertsSpec, bias: Tensor | None = None) -> Routing:
    """The router's step (chapter "Experts"), from its logits ``(N, E)``, one row per token.

    1. scores: a softmax over the experts (Mixtral, Qwen3-MoE) or a sigmoid of each (DeepSeek-V3);
    2. the choice: the top k of ``scores + bias`` (the bias moves the choice only); with groups,
       each group is scored by the sum of its two best, and only the best ``topk_groups`` groups'
       experts may be chosen;
    3. the weights: the chosen experts' *scores* (never the bias), divided by their sum if
       ``norm_topk`` (plus 1e-20, as DeepSeek-V3), times ``scaling``.
    """
    E = spec.n_experts
    if logits.dim() != 2 or logits.shape[1] != E:
        raise ValueError(f"logits must be (N, n_experts={E}), got shape {tuple(logits.shape)}")
    scores = logits.softmax(-1) if spec.score == "softmax" else logits.sigmoid()  # (N, E)
    choice = scores if bias is None else scores + bias
    if spec.n_groups > 1:
        grouped = choice.view(-1, spec.n_groups, E // spec.n_groups)  # (N, groups, per group)
        group_scores = grouped.topk(2, dim=-1).values.sum(-1)  # (N, groups)
        best = group_scores.topk(spec.topk_groups, dim=-1).indices  # (N, topk_groups)
        allowed = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, best, True)
        allowed = allowed.unsqueeze(-1).expand_as(grouped).reshape(-1, E)  # (N, E)
        choice = choice.masked_fill(~allowed, float("-inf"))
    chosen = choice.topk(spec.top_k, dim=-1).indices  # (N, k)
    weights = scores.gather(1, chosen)  # (N, k): the scores, not scores + bias
    if spec.norm_topk:
        weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
    return Routing(weights * spec.scaling, chosen, logits, scores)


def expert_loads(chosen: Tensor, n_experts: int) -> Tensor:
    """How many of the ``N k`` assignments ``chosen (N, k)`` each expert got (chapter "Experts"):
    ``(n_experts,)``, summing to N k."""
    return torch.bincount(chosen.reshape(-1), minlength=n_experts)


def load_balancing_loss(scores: Tensor, chosen: Tensor, *, balanced: str = "one") -> Tensor:
    """The Switch Transformer's balancing loss ``E * sum_i f_i P_i`` for one group of tokens (chapter "Experts").

    ``P_i`` is the mean score (router probability) of expert ``i`` over the ``N`` tokens and
    ``f_i`` the share of tokens sent to it. Two conventions for ``f_i`` with top k:

    - ``balanced="one"``: ``f_i`` is expert ``i``'s share of the ``N k`` assignments, so a
      perfectly balanced router scores 1 (the Switch paper's value; the book's training loss);
    - ``balanced="k"``: ``f_i`` counts assignments per token (share of N), so balance scores k.
      This is ``transformers``' ``load_balancing_loss_func``.

    Over several layers, ``load_balancing_loss_func`` concatenates every layer's tokens and
    computes one loss; the book averages the layers' losses (others sum them): pass each layer's
    tensors here and combine as the convention says.
    """
    if balanced not in ("one", "k"):
        raise ValueError(f"balanced must be 'one' (Switch's) or 'k' (transformers'), got {balanced!r}")
    N, E = scores.shape
    k = chosen.shape[1]
    counts = F.one_hot(chosen, E).to(scores.dtype).sum(dim=(0, 1))  # (E,) assignments per expert
    f = counts / (N * k if balanced == "one" else N)
    return E * (f * scores.mean(0)).sum()


def router_z_loss(logits: Tensor) -> Tensor:
    """ST-MoE's router z-loss (chapter "Experts"): the mean over tokens of ``logsumexp(logits)^2``; it keeps the
    router's logits small, so its softmax stays far from saturating."""
    return torch.logsumexp(logits, dim=-1).pow(2).mean()


def _expert_stack(experts: nn.ModuleList) -> tuple[Tensor, Tensor, Tensor]:
    """The experts' matrices stacked: gate and up ``(E, d, h)``, down ``(E, h, d)``."""
    gate = torch.stack([e.gate_proj.weight.t() for e in experts])
    up = torch.stack([e.up_proj.weight.t() for e in experts])
    down = torch.stack([e.down_proj.weight.t() for e in experts])
    return gate, up, down


def combine_plainly(x: Tensor, routing: Routing, experts: nn.ModuleList) -> Tensor:
    """Dispatch and combine written plainly (chapter "Experts"): for each token, for each of its k experts, add the
    expert's output times its weight. ``x (N, d)`` -> ``(N, d)``. Slow; the definition."""
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for slot in range(routing.chosen.shape[1]):
            e = int(routing.chosen[t, slot])
            out[t] = out[t] + routing.weights[t, slot] * experts[e](x[t : t + 1])[0]
    return out


def capacity_of(n_tokens: int, spec: ExpertsSpec) -> int:
    """The slots per expert for ``n_tokens`` tokens: ``ceil(capacity * k N / E)`` (at least 1)."""
    return max(1, math.ceil(spec.capacity * spec.top_k * n_tokens / spec.n_experts))


def combine_grouped(
    x: Tensor, routing: Routing, experts: nn.ModuleList, capacity: int | None = None
) -> tuple[Tensor, Tensor]:
    """Dispatch and combine as one grouped computation (chapter "Experts"): the ``N k`` assignments sorted by expert
    into a buffer ``(E, C, d)`` of ``C`` slots per expert, every expert run on its buffer at once
    (batched matrix products of the stacked weights), the outputs weighted and added back.

    ``capacity`` is ``C``; an assignment past its expert's ``C`` slots is dropped (the token gets
    nothing from that expert; its residual carries it). None: ``C`` is the largest load, nothing
    is dropped, and the output equals :func:`combine_plainly`'s. Returns ``(out (N, d), dropped (N, k))``.
    """
    N, d = x.shape
    E, k = len(experts), routing.chosen.shape[1]
    flat = routing.chosen.reshape(-1)  # (N k,) the expert of each assignment, token-major
    order = torch.argsort(flat, stable=True)  # assignments grouped by expert, earlier tokens first
    loads = torch.bincount(flat, minlength=E)
    starts = torch.cumsum(loads, 0) - loads  # (E,) where each expert's run begins in `order`
    rank = torch.empty_like(flat)
    rank[order] = torch.arange(N * k, device=x.device) - starts[flat[order]]  # slot within its expert
    C = int(loads.max()) if capacity is None else capacity
    kept = rank < C  # (N k,)
    token = torch.arange(N, device=x.device).repeat_interleave(k)  # (N k,) the token of each assignment
    buffer = x.new_zeros(E, C, d)
    buffer[flat[kept], rank[kept]] = x[token[kept]]
    gate, up, down = _expert_stack(experts)  # (E, d, h), (E, d, h), (E, h, d)
    hidden = F.silu(torch.bmm(buffer, gate)) * torch.bmm(buffer, up)  # (E, C, h)
    outputs = torch.bmm(hidden, down)  # (E, C, d)
    out = torch.zeros_like(x)
    weights = routing.weights.reshape(-1)[kept].unsqueeze(-1)  # (kept, 1)
    out.index_add_(0, token[kept], weights * outputs[flat[kept], rank[kept]])
    return out, (~kept).view(N, k)


class Experts(nn.Module):
    """A mixture-of-experts feed-forward layer (chapter "Experts"): ``x (B, T, d_model)`` in and out.

    ``gate`` is the router (``d_model -> n_experts``, no bias, as all three families); ``experts``
    are :class:`~transformer_lib.modern_block.SwiGLU` networks of width ``d_expert``; ``shared``
    (with ``n_shared``) is one SwiGLU network ``n_shared * d_expert`` wide that every token passes
    through (DeepSeek-V3's). ``score_bias (E,)`` is the bias that moves the choice
    (DeepSeek-V3's ``e_score_correction_bias``), a buffer that :meth:`after_step` updates.

    With ``capacity``, training runs :func:`combine_grouped` and drops what overflows; in eval mode
    every token reaches its experts, so that a token's output does not depend on the batch it is
    decoded in (cached decoding equals the full forward).

    After each forward, ``loads`` holds how many assignments each expert got, and ``routing`` the
    last :class:`Routing` (detached); in training mode ``training_loss`` holds the weighted
    balancing terms (see the module's docstring), else None.
    """

    part_role = "feed_forward"  # the router's matrix; each expert is a SwiGLU part of its own
    part_matrices = {"router": "gate.weight"}

    def __init__(self, d_model: int, spec: ExpertsSpec, *, d_ff: int | None = None, bias: bool = False):
        super().__init__()
        check_int(d_model, "d_model")
        if not isinstance(spec, ExpertsSpec):
            raise TypeError(f"spec must be an ExpertsSpec, got {type(spec).__name__}")
        self.spec, self.d_model = spec, d_model
        width = spec.d_expert or d_ff or swiglu_hidden(d_model)
        self.d_expert = width
        self.gate = nn.Linear(d_model, spec.n_experts, bias=False)
        self.experts = nn.ModuleList(SwiGLU(d_model, width, bias=bias) for _ in range(spec.n_experts))
        self.shared = SwiGLU(d_model, spec.n_shared * width, bias=bias) if spec.n_shared else None
        self.register_buffer("score_bias", torch.zeros(spec.n_experts))
        self.register_buffer("_pending_loads", torch.zeros(spec.n_experts), persistent=False)
        self.loads: Tensor | None = None
        self.routing: Routing | None = None
        self.training_loss: Tensor | None = None

    def __getstate__(self) -> dict:
        """The layer's state for a copy or a pickle: ``training_loss`` left out, a tensor of the last
        step's graph, not of the layer."""
        return {**self.__dict__, "training_loss": None}

    def forward(self, x: Tensor) -> Tensor:
        """``x (B, T, d_model)`` -> ``(B, T, d_model)``: each token's k experts, weighted, plus the shared ones."""
        if x.shape[-1] != self.d_model:
            raise ValueError(f"expected last dimension d_model={self.d_model}, got shape {tuple(x.shape)}")
        flat = x.reshape(-1, self.d_model)  # (N, d)
        routing = route(self.gate(flat), self.spec, self.score_bias)
        if self.spec.capacity is None or not self.training:  # a capacity drops tokens in training only
            out = self._combine_by_expert(flat, routing)
        else:
            out, _ = combine_grouped(flat, routing, self.experts, capacity_of(flat.shape[0], self.spec))
        if self.shared is not None:
            out = out + self.shared(flat)
        self._record(routing)
        return out.view_as(x)

    def _combine_by_expert(self, x: Tensor, routing: Routing) -> Tensor:
        """A loop over the experts that received tokens: each runs once on its tokens (``transformers``' eager form)."""
        out = torch.zeros_like(x)
        for e in torch.unique(routing.chosen).tolist():
            token, slot = torch.where(routing.chosen == e)
            out.index_add_(0, token, routing.weights[token, slot, None] * self.experts[e](x[token]))
        return out

    def _record(self, routing: Routing) -> None:
        loads = expert_loads(routing.chosen, self.spec.n_experts)
        self.loads = loads
        self.routing = Routing(*(t.detach() for t in routing))
        if not self.training:
            self.training_loss = None
            return
        self._pending_loads += loads.to(self._pending_loads.dtype)
        terms = []
        if self.spec.aux_loss:
            terms.append(self.spec.aux_loss * load_balancing_loss(routing.scores, routing.chosen))
        if self.spec.z_loss:
            terms.append(self.spec.z_loss * router_z_loss(routing.logits))
        self.training_loss = sum(terms) if terms else None

    @torch.no_grad()
    def after_step(self) -> None:
        """After an optimizer step: DeepSeek-V3's auxiliary-loss-free balancing. Each expert's
        ``score_bias`` moves by ``bias_rate`` towards balance: down for an expert that got more
        than the mean load since the last step, up for one that got less. The bias changes which
        experts are chosen, never the weights they are combined with. Under ``torch.distributed``
        the loads are summed over the processes first, so that every process moves its biases alike
        (DeepSeek-V3 balances the global batch)."""
        if self.spec.bias_rate and torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.all_reduce(self._pending_loads)
        if self.spec.bias_rate and self._pending_loads.sum() > 0:
            error = self._pending_loads.mean() - self._pending_loads
            self.score_bias += self.spec.bias_rate * torch.sign(error).to(self.score_bias.dtype)
        self._pending_loads.zero_()

    def extra_repr(self) -> str:
        s = self.spec
        return f"n_experts={s.n_experts}, top_k={s.top_k}, d_expert={self.d_expert}, score={s.score!r}"


def experts_layers(model: nn.Module) -> dict[str, Experts]:
    """Every :class:`Experts` layer of ``model``, by name, in order (chapter "Experts")."""
    return {name: m for name, m in model.named_modules() if isinstance(m, Experts)}


def training_loss(model: nn.Module) -> Tensor | None:
    """The mean over ``model``'s experts layers of the balancing terms of their last training forward, or None."""
    terms = [m.training_loss for m in experts_layers(model).values() if m.training_loss is not None]
    return torch.stack(terms).mean() if terms else None


def after_step(model: nn.Module) -> None:
    """Call every experts layer's :meth:`Experts.after_step` (the training loop does, after each optimizer step)."""
    for layer in experts_layers(model).values():
        layer.after_step()


def active_parameters(model: nn.Module) -> int:
    """The parameters one token uses (chapter "Experts"): all of ``model``'s, less the routed experts it is not sent
    to (each layer's ``n_experts - top_k`` of them). Embeddings count as in ``sum(p.numel())``."""
    total = sum(p.numel() for p in model.parameters())
    for layer in experts_layers(model).values():
        per_expert = sum(p.numel() for p in layer.experts[0].parameters())
        total -= (layer.spec.n_experts - layer.spec.top_k) * per_expert
    return total
