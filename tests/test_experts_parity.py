"""The book's Experts layer computes what transformers' mixture-of-experts blocks compute, given the
same random weights (no download), in float64: ``Qwen3MoeSparseMoeBlock`` (softmax, top k,
renormalised or not), ``MixtralSparseMoeBlock`` (a softmax over the top k) and ``DeepseekV3MoE``
(sigmoid, groups, a bias that moves the choice, a scaling, shared experts). For each: the experts
chosen (as a set per token: DeepSeek-V3's top k is unsorted), their weights and the outputs.

transformers' routers compute their scores in float32 (DeepSeek-V3's logits too) even in a float64
block. The exact comparisons take the same step in float32 on the book's side (``route`` on float32
logits) and then combine in float64; the layer's own forward, all in float64, is compared to the
rounding of float32. Every test asserts that its top-k choices have a margin far above float32's
rounding, so that no near tie can make it pass or fail by chance.

And ``load_balancing_loss_func`` (in modeling_mixtral and modeling_qwen3_moe): for one layer it is
``load_balancing_loss(scores, chosen, balanced="k")``; for several it is that loss over the layers'
tokens concatenated, which is not the mean of the layers' losses. Last, the converters' bad input.
"""

import warnings
from dataclasses import replace
from itertools import chain

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from transformer_lib.experts import Experts, ExpertsSpec, Routing, combine_grouped, load_balancing_loss, route
from transformer_lib.pretrained_experts import experts_from_deepseek_v3, experts_from_mixtral, experts_from_qwen3_moe

transformers = pytest.importorskip("transformers")
from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MoE  # noqa: E402
from transformers.models.mixtral import modeling_mixtral  # noqa: E402
from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock  # noqa: E402
from transformers.models.qwen3_moe import modeling_qwen3_moe  # noqa: E402
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock  # noqa: E402

D, H = 16, 8  # hidden_size, each expert's width (moe_intermediate_size / intermediate_size)
MARGIN = 1e-4  # the least gap a top-k choice must have: float32 rounds the scores by about 1e-7


def randomise(block: nn.Module, seed: int, *, router_std: float = 0.5, bias_std: float = 0.5) -> nn.Module:
    """Every parameter and buffer of ``block`` drawn from a seeded generator, in float64: the router
    ``router_std`` (logits of about 2 for D = 16: few near ties), DeepSeek-V3's choice bias
    ``bias_std`` (a sigmoid score is in (0, 1): the bias changes choices), matrices 1/sqrt(fan in)."""
    g = torch.Generator().manual_seed(seed)
    block = block.double().eval()
    with torch.no_grad():
        for name, t in chain(block.named_parameters(), block.named_buffers()):
            std = router_std if name == "gate.weight" else bias_std if "bias" in name else max(1, t.shape[-1]) ** -0.5
            t.copy_(std * torch.randn(t.shape, generator=g, dtype=torch.float64))
    return block


def qwen3(norm_topk_prob=True, seed=0, **extra):
    config = transformers.Qwen3MoeConfig(
        hidden_size=D,
        moe_intermediate_size=H,
        num_experts=8,
        num_experts_per_tok=2,
        norm_topk_prob=norm_topk_prob,
        experts_implementation="eager",
        **extra,
    )
    return randomise(Qwen3MoeSparseMoeBlock(config), seed)


def mixtral(seed=1, **extra):
    config = transformers.MixtralConfig(
        hidden_size=D,
        intermediate_size=H,
        num_local_experts=8,
        num_experts_per_tok=2,
        experts_implementation="eager",
        **extra,
    )
    return randomise(MixtralSparseMoeBlock(config), seed)


def deepseek(n_group=4, topk_group=2, scaling=2.5, n_shared=1, norm=True, seed=2, **extra):
    config = transformers.DeepseekV3Config(
        hidden_size=D,
        moe_intermediate_size=H,
        n_routed_experts=16,
        num_experts_per_tok=3,
        n_group=n_group,
        topk_group=topk_group,
        routed_scaling_factor=scaling,
        n_shared_experts=n_shared,
        norm_topk_prob=norm,
        experts_implementation="eager",
        **extra,
    )
    with warnings.catch_warnings():  # n_shared_experts=0 makes empty shared matrices, and torch says so
        warnings.filterwarnings("ignore", "Initializing zero-element tensors", UserWarning)
        return randomise(DeepseekV3MoE(config), seed)


X = torch.randn(3, 16, D, generator=torch.Generator().manual_seed(10), dtype=torch.float64)  # (B, T, d)
FLAT = X.view(-1, D)  # (N, d)


def book_logits32(block: nn.Module, layer: Experts) -> torch.Tensor:
    """The book's router logits ``(N, E)`` in float32, as the block computes them: Qwen3 and Mixtral
    take the product in the block's dtype and round it; DeepSeek-V3 multiplies in float32."""
    if isinstance(block, DeepseekV3MoE):
        return F.linear(FLAT.float(), layer.gate.weight.float())
    return layer.gate(FLAT).float()


def by_expert(chosen: torch.Tensor, weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``chosen (N, k)`` and ``weights (N, k)`` reordered by expert, so that the sets compare."""
    order = chosen.argsort(-1)
    return chosen.gather(1, order), weights.gather(1, order)


def choice_margin(scores: torch.Tensor, layer: Experts) -> float:
    """The least gap over the tokens between the last value chosen and the first passed over: of the
    group scores (with groups), then of ``scores + bias`` within the allowed groups."""
    spec, choice = layer.spec, scores.double() + layer.score_bias  # (N, E)
    gaps = []
    if spec.n_groups > 1:
        grouped = choice.view(len(choice), spec.n_groups, -1)  # (N, groups, per group)
        group_scores = grouped.topk(2, dim=-1).values.sum(-1)  # (N, groups)
        ranked = group_scores.sort(-1, descending=True).values
        gaps.append(ranked[:, spec.topk_groups - 1] - ranked[:, spec.topk_groups])
        allowed = group_scores >= ranked[:, spec.topk_groups - 1 : spec.topk_groups]  # (N, groups)
        choice = choice.masked_fill(~allowed.repeat_interleave(spec.n_experts // spec.n_groups, 1), -torch.inf)
    ranked = choice.sort(-1, descending=True).values
    gaps.append(ranked[:, spec.top_k - 1] - ranked[:, spec.top_k])
    return min(g.min().item() for g in gaps)


BLOCKS = {
    "qwen3, renormalised": (lambda: qwen3(True), experts_from_qwen3_moe),
    "qwen3, not renormalised": (lambda: qwen3(False), experts_from_qwen3_moe),
    "mixtral": (mixtral, experts_from_mixtral),
    "deepseek, 2 of 4 groups, scaling 2.5, 1 shared": (deepseek, experts_from_deepseek_v3),
    "deepseek, 1 of 2 groups, scaling 0.5, 2 shared, not renormalised": (
        lambda: deepseek(n_group=2, topk_group=1, scaling=0.5, n_shared=2, norm=False, seed=3),
        experts_from_deepseek_v3,
    ),
    "deepseek, no groups, no shared": (
        lambda: deepseek(n_group=1, topk_group=1, n_shared=0, seed=4),
        experts_from_deepseek_v3,
    ),
}


@pytest.fixture(params=list(BLOCKS), scope="module")
def converted(request):
    make, convert = BLOCKS[request.param]
    block = make()
    return block, convert(block)


def test_the_chosen_experts_and_their_weights_equal_the_blocks(converted):
    block, layer = converted
    with torch.no_grad():
        _, their_weights, their_chosen = block.gate(FLAT)  # (N, k) each
        ours = route(book_logits32(block, layer), layer.spec, layer.score_bias)
    assert choice_margin(ours.scores, layer) > MARGIN
    their_chosen, their_weights = by_expert(their_chosen, their_weights.double())
    our_chosen, our_weights = by_expert(ours.chosen, ours.weights.double())
    assert torch.equal(our_chosen, their_chosen)
    # the same float32 steps; a sum of k weights taken in another order (DeepSeek-V3's unsorted
    # top k) may move the last float32 bit
    torch.testing.assert_close(our_weights, their_weights, rtol=3e-7, atol=0)


def test_the_outputs_equal_the_blocks(converted):
    block, layer = converted
    with torch.no_grad():
        expected = block(X)  # (B, T, d)
        ours = route(book_logits32(block, layer), layer.spec, layer.score_bias)
        exact = Routing(ours.weights.double(), ours.chosen, ours.logits, ours.scores)
        out, _ = combine_grouped(FLAT, exact, layer.experts)  # the book's float64 experts, their float32 router
        if layer.shared is not None:
            out = out + layer.shared(FLAT)
        assert (out.view_as(X) - expected).abs().max().item() < 1e-12
        # the layer's own forward routes in float64: its weights differ from the block's float32
        # ones by float32's rounding (3e-8 to 9e-8 of the largest output here), and so do the outputs
        forward = layer(X)
        assert (forward - expected).abs().max().item() < 1e-6 * expected.abs().max().item()
        assert torch.equal(layer.routing.chosen.sort(-1).values, ours.chosen.sort(-1).values)  # the margin's work


def test_the_specs_say_each_familys_routing():
    qwen_layer = experts_from_qwen3_moe(qwen3(False))
    s = qwen_layer.spec
    assert (s.score, s.norm_topk, s.n_experts, s.top_k, s.d_expert, s.n_shared, s.n_groups, s.scaling) == (
        "softmax",
        False,
        8,
        2,
        H,
        0,
        1,
        1.0,
    )
    assert (s.aux_loss, s.z_loss, s.bias_rate, s.capacity) == (0.0, 0.0, 0.0, None)  # no training term unless asked
    assert qwen_layer.gate.weight.dtype == torch.float64 and not qwen_layer.training  # the block's dtype and mode
    assert experts_from_mixtral(mixtral()).spec.norm_topk is True
    block = deepseek()
    layer = experts_from_deepseek_v3(block, aux_loss=0.01, bias_rate=1e-3)
    s = layer.spec
    assert (s.score, s.norm_topk, s.n_experts, s.top_k, s.n_shared, s.n_groups, s.topk_groups, s.scaling) == (
        "sigmoid",
        True,
        16,
        3,
        1,
        4,
        2,
        2.5,
    )
    assert (s.aux_loss, s.bias_rate) == (0.01, 1e-3)
    assert torch.equal(layer.score_bias, block.gate.e_score_correction_bias)
    assert torch.equal(layer.experts[5].up_proj.weight, block.experts.gate_up_proj[5, H:])


def test_the_deepseek_bias_and_groups_change_the_choice():
    """Without them the test above would not see a bias or a group mask read wrongly."""
    block = deepseek()
    layer = experts_from_deepseek_v3(block)
    logits = book_logits32(block, layer)
    chosen = route(logits, layer.spec, layer.score_bias).chosen.sort(-1).values
    no_bias = route(logits, layer.spec).chosen.sort(-1).values
    all_groups = route(logits, replace(layer.spec, topk_groups=4), layer.score_bias).chosen.sort(-1).values
    assert (chosen != no_bias).any(-1).sum() >= 5
    assert (chosen != all_groups).any(-1).sum() >= 5


# transformers' Switch loss, in two modules of the same code
LOSS_FUNCTIONS = [modeling_mixtral.load_balancing_loss_func, modeling_qwen3_moe.load_balancing_loss_func]


def layer_logits(n_layers: int, N=40, E=8, seed=20) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    # layers of different balance, so that their f and P differ
    return [(1 + i) * torch.randn(N, E, generator=g, dtype=torch.float64) for i in range(n_layers)]


def spec(E=8, k=2):
    return ExpertsSpec(n_experts=E, top_k=k)


@pytest.mark.parametrize("loss_func", LOSS_FUNCTIONS)
def test_transformers_balancing_loss_of_one_layer_is_balanced_k(loss_func):
    (logits,) = layer_logits(1)
    r = route(logits, spec())
    theirs = loss_func((logits,), 8, 2)
    # transformers sums the counts and probabilities in float32
    torch.testing.assert_close(
        load_balancing_loss(r.scores, r.chosen, balanced="k"), theirs.double(), rtol=1e-6, atol=0
    )
    torch.testing.assert_close(
        load_balancing_loss(r.scores, r.chosen, balanced="one"), theirs.double() / 2, rtol=1e-6, atol=0
    )


@pytest.mark.parametrize("loss_func", LOSS_FUNCTIONS)
def test_transformers_balancing_loss_of_layers_is_the_loss_of_their_tokens_concatenated(loss_func):
    logits = layer_logits(3)
    theirs = loss_func(tuple(logits), 8, 2).double()
    routed = [route(x, spec()) for x in logits]
    scores, chosen = torch.cat([r.scores for r in routed]), torch.cat([r.chosen for r in routed])
    torch.testing.assert_close(load_balancing_loss(scores, chosen, balanced="k"), theirs, rtol=1e-6, atol=0)
    per_layer = torch.stack([load_balancing_loss(r.scores, r.chosen, balanced="k") for r in routed])
    assert (per_layer.mean() - theirs).abs().item() > 1e-2  # not the mean of the layers' losses


def test_a_perfectly_balanced_router_scores_k_or_one():
    """Token t's logits are one strictly decreasing row turned by t places: over E tokens every
    expert has every probability once (mean 1/E) and is chosen k times."""
    E, k = 8, 3
    row = torch.linspace(2.0, 0.0, E, dtype=torch.float64)
    logits = torch.stack([row.roll(t) for t in range(2 * E)])  # (N, E)
    r = route(logits, spec(E, k))
    assert torch.bincount(r.chosen.reshape(-1), minlength=E).tolist() == [2 * k] * E
    assert abs(load_balancing_loss(r.scores, r.chosen, balanced="k").item() - k) < 1e-12
    assert abs(load_balancing_loss(r.scores, r.chosen, balanced="one").item() - 1) < 1e-12
    assert abs(modeling_mixtral.load_balancing_loss_func((logits,), E, k).item() - k) < 1e-5  # float32 sums
    collapsed = route(logits[:1].expand(2 * E, E), spec(E, k))  # every token sends to the same k
    assert load_balancing_loss(collapsed.scores, collapsed.chosen, balanced="one").item() > 1.5


# Bad input: a wrong object names itself; a block the book's layer cannot say is refused by name.
@pytest.mark.parametrize(
    "convert, wrong",
    [
        (experts_from_qwen3_moe, lambda: mixtral()),
        (experts_from_mixtral, lambda: qwen3()),
        (experts_from_deepseek_v3, lambda: qwen3()),
        (experts_from_qwen3_moe, lambda: nn.Linear(2, 2)),
        (experts_from_deepseek_v3, lambda: None),
        (experts_from_mixtral, lambda: {"gate.weight": torch.zeros(8, D)}),
    ],
)
def test_a_wrong_object_is_a_type_error_naming_it(convert, wrong):
    obj = wrong()
    with pytest.raises(TypeError, match=type(obj).__name__):
        convert(obj)


def with_gelu(block):
    block.experts.act_fn = nn.GELU()
    return block


def with_expert_bias(block):
    block.experts.gate_up_proj_bias = nn.Parameter(torch.zeros(8, 2 * H, dtype=torch.float64))
    return block


def with_shared_bias(block):
    block.shared_experts.up_proj = nn.Linear(D, H, bias=True).double()
    return block


def with_jitter(block):
    block.jitter_noise = 0.1
    return block


@pytest.mark.parametrize(
    "convert, make, word",
    [
        (experts_from_qwen3_moe, lambda: with_gelu(qwen3()), "GELU"),
        (experts_from_deepseek_v3, lambda: deepseek(hidden_act="gelu"), "hidden_act='gelu'"),
        (experts_from_qwen3_moe, lambda: with_expert_bias(qwen3()), "experts.gate_up_proj_bias"),
        (experts_from_deepseek_v3, lambda: with_shared_bias(deepseek()), "shared_experts.up_proj.bias"),
        (experts_from_mixtral, lambda: with_jitter(mixtral()), "router_jitter_noise"),
    ],
)
def test_what_the_layer_cannot_say_is_refused_by_name(convert, make, word):
    with pytest.raises(ValueError, match=word):
        convert(make())


def test_an_unknown_option_is_refused_by_name():
    with pytest.raises(TypeError, match="top_k"):
        experts_from_mixtral(mixtral(), top_k=3)  # the routing comes from the block
