"""Chapter "Experts": the router, the three ways of combining the experts, the capacity, the balancing
terms and the choice bias, each by a property that a wrong version breaks. Parity with production
blocks is in test_experts_parity.py; every tool on an experts recipe in test_recipes_compose.py."""

import copy
import dataclasses
import math

import pytest
import torch

import transformer_lib as tl
from transformer_lib.experts import (
    Experts,
    ExpertsSpec,
    Routing,
    active_parameters,
    combine_grouped,
    combine_plainly,
    expert_loads,
    experts_layers,
    load_balancing_loss,
    route,
    router_z_loss,
    spec_from_dict,
    spec_from_flat,
)

SPECS = {
    "mixtral": ExpertsSpec(n_experts=4, top_k=2),
    "top1-unnormalised": ExpertsSpec(n_experts=4, top_k=1, norm_topk=False),
    "deepseek": ExpertsSpec(n_experts=8, top_k=3, score="sigmoid", n_groups=4, topk_groups=2, scaling=2.5, n_shared=1),
}


def layer(spec, d=12, seed=0):
    torch.manual_seed(seed)
    return Experts(d, spec, d_ff=10).double()


def tokens(n=40, d=12, seed=1):
    return torch.randn(n, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


@pytest.mark.parametrize("name", list(SPECS))
def test_plain_by_expert_and_grouped_combines_are_equal(name):
    experts = layer(SPECS[name])
    x = tokens()
    routing = route(experts.gate(x), experts.spec, experts.score_bias)
    plain = combine_plainly(x, routing, experts.experts)
    by_expert = experts._combine_by_expert(x, routing)
    grouped, dropped = combine_grouped(x, routing, experts.experts)
    assert not dropped.any()
    torch.testing.assert_close(by_expert, plain, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(grouped, plain, rtol=1e-12, atol=1e-12)


def test_the_combine_is_the_weighted_sum_of_the_chosen_experts_only():
    experts = layer(SPECS["mixtral"])
    x = tokens(3)
    routing = route(experts.gate(x), experts.spec)
    out = experts(x.unsqueeze(0))[0]
    for t in range(3):
        outputs = [experts.experts[int(e)](x[t : t + 1])[0] for e in routing.chosen[t]]
        want = sum(w * o for w, o in zip(routing.weights[t], outputs, strict=True))
        torch.testing.assert_close(out[t], want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("capacity", [1, 3, 7])
def test_a_capacity_drops_exactly_the_assignments_past_each_experts_slots_later_tokens_first(capacity):
    experts = layer(SPECS["mixtral"])
    x = tokens(20)
    routing = route(experts.gate(x), experts.spec)
    out, dropped = combine_grouped(x, routing, experts.experts, capacity)
    loads = expert_loads(routing.chosen, 4)
    assert int(dropped.sum()) == int((loads - capacity).clamp(min=0).sum())
    for e in range(4):  # an expert keeps its first `capacity` tokens, in token order
        mine = routing.chosen == e
        kept_tokens = torch.where((mine & ~dropped).any(1))[0]
        assert torch.equal(kept_tokens, torch.where(mine.any(1))[0][:capacity])
    keep = ~dropped
    kept_only = Routing(routing.weights * keep, routing.chosen, routing.logits, routing.scores)
    want = combine_plainly(x, kept_only, experts.experts)
    torch.testing.assert_close(out, want, rtol=1e-12, atol=1e-12)


def test_a_capacity_applies_in_training_only():
    spec = dataclasses.replace(SPECS["mixtral"], capacity=0.25)
    experts = layer(spec)
    x = tokens(32).unsqueeze(0)
    full = layer(SPECS["mixtral"])
    full.load_state_dict(experts.state_dict())
    experts.eval()
    torch.testing.assert_close(experts(x), full(x), rtol=0, atol=0)
    experts.train()
    assert not torch.allclose(experts(x), full(x))  # a quarter of the slots: tokens are dropped


@pytest.mark.parametrize("name", list(SPECS))
def test_the_weights_are_the_chosen_scores_renormalised_and_scaled(name):
    spec = SPECS[name]
    logits = tokens(30, spec.n_experts, seed=2)
    r = route(logits, spec)
    scores = logits.softmax(-1) if spec.score == "softmax" else logits.sigmoid()
    torch.testing.assert_close(r.scores, scores)
    raw = scores.gather(1, r.chosen)
    want = raw / raw.sum(-1, keepdim=True) if spec.norm_topk else raw
    torch.testing.assert_close(r.weights, want * spec.scaling)
    if spec.norm_topk:
        torch.testing.assert_close(r.weights.sum(-1), torch.full((30,), spec.scaling, dtype=torch.float64))


def test_without_groups_the_choice_is_the_top_k_scores():
    spec = SPECS["mixtral"]
    logits = tokens(30, 4, seed=3)
    chosen = route(logits, spec).chosen
    rest = torch.ones_like(logits, dtype=torch.bool).scatter_(1, chosen, False)
    assert (logits.gather(1, chosen).min(1).values > logits.masked_fill(~rest, -math.inf).max(1).values).all()


def test_groups_limit_the_choice_to_the_best_groups_by_their_two_best_scores():
    spec = SPECS["deepseek"]  # 8 experts in 4 groups of 2, 2 groups allowed
    logits = tokens(50, 8, seed=4)
    r = route(logits, spec)
    group_scores = r.scores.view(50, 4, 2).sum(-1)  # two per group: the sum of both
    best = group_scores.topk(2, dim=-1).indices
    chosen_groups = r.chosen // 2
    assert all(set(chosen_groups[t].tolist()) <= set(best[t].tolist()) for t in range(50))


def test_the_bias_moves_the_choice_and_never_the_weights():
    spec = dataclasses.replace(SPECS["deepseek"], n_groups=1, topk_groups=1)
    logits = tokens(25, 8, seed=5)
    bias = torch.zeros(8, dtype=torch.float64)
    bias[6] = 10.0  # far above any sigmoid
    r = route(logits, spec, bias)
    assert (r.chosen == 6).any(1).all()  # every token now picks expert 6 ...
    plain = logits.sigmoid().gather(1, r.chosen)  # ... with its score as weight, not score + bias
    torch.testing.assert_close(r.weights, plain / plain.sum(-1, keepdim=True) * spec.scaling)


def test_balancing_loss_conventions_at_balance_and_at_collapse():
    N, E, k = 8, 4, 2
    uniform = torch.full((N, E), 1 / E, dtype=torch.float64)
    balanced = torch.tensor([[0, 1], [2, 3]] * (N // 2))  # every expert gets N k / E assignments
    assert load_balancing_loss(uniform, balanced).item() == pytest.approx(1.0)
    assert load_balancing_loss(uniform, balanced, balanced="k").item() == pytest.approx(k)
    collapsed_scores = torch.tensor([[0.5, 0.5, 0.0, 0.0]] * N, dtype=torch.float64)
    collapsed = torch.tensor([[0, 1]] * N)
    assert load_balancing_loss(collapsed_scores, collapsed).item() == pytest.approx(E / 2)  # E/k: the worst with k=2
    with pytest.raises(ValueError, match="balanced"):
        load_balancing_loss(uniform, balanced, balanced="two")


def test_the_balancing_loss_pushes_scores_away_from_loaded_experts():
    r = route(tokens(16, 4, seed=6), SPECS["mixtral"])
    loads = expert_loads(r.chosen, 4).double()
    # the gradient on each token's score of expert i is E f_i / N: largest for the most loaded expert,
    # and the counts f_i carry none (a top-k has no gradient)
    scores = r.scores.detach().requires_grad_()
    load_balancing_loss(scores, r.chosen).backward()
    torch.testing.assert_close(scores.grad[0], 4 * loads / loads.sum() / 16)


def test_router_z_loss_is_the_mean_squared_logsumexp():
    logits = tokens(10, 4, seed=7)
    want = sum(torch.logsumexp(logits[t], 0) ** 2 for t in range(10)) / 10
    torch.testing.assert_close(router_z_loss(logits), want)
    assert router_z_loss(logits + 5) > router_z_loss(logits)  # a softmax does not see the shift; the z-loss does


def test_a_training_forward_adds_the_mean_balancing_term_and_an_eval_forward_adds_none():
    torch.manual_seed(0)
    spec = {"n_experts": 4, "aux_loss": 0.5, "z_loss": 0.1, "dense_layers": 1}
    model = tl.GPT(tl.GPTConfig(20, 16, 3, 2, 16, recipe="experts", experts=spec)).double()
    x = torch.randint(0, 20, (2, 16), generator=torch.Generator().manual_seed(0))
    _, eval_loss = model.eval()(x, x)
    _, train_loss = model.train()(x, x)
    layers = list(experts_layers(model).values())
    assert len(layers) == 2 and isinstance(model.decoder.layers[0].ff, tl.SwiGLU)  # the first layer dense
    terms = []
    for lay in layers:
        r = lay.routing
        terms.append(0.5 * load_balancing_loss(r.scores, r.chosen) + 0.1 * router_z_loss(r.logits))
    torch.testing.assert_close(train_loss - eval_loss, torch.stack(terms).mean())
    without = tl.GPT(tl.GPTConfig(20, 16, 3, 2, 16, recipe="experts", experts={**spec, "aux_loss": 0, "z_loss": 0}))
    without.double().load_state_dict(model.state_dict())
    torch.testing.assert_close(without.train()(x, x)[1], eval_loss, rtol=0, atol=0)


def test_a_model_copies_after_a_training_forward():
    torch.manual_seed(0)
    model = tl.GPT(tl.GPTConfig(20, 16, 1, 2, 16, recipe="experts", experts={"n_experts": 4})).train()
    x = torch.randint(0, 20, (2, 16))
    model(x, x)
    copied = copy.deepcopy(model)
    assert copied.decoder.layers[0].ff.training_loss is None
    assert torch.equal(copied.eval()(x)[0], model.eval()(x)[0])


def test_the_router_learns_through_the_weights_even_without_a_balancing_loss():
    torch.manual_seed(0)
    model = tl.GPT(tl.GPTConfig(20, 16, 1, 2, 16, recipe="experts", experts={"n_experts": 4, "aux_loss": 0}))
    x = torch.randint(0, 20, (2, 16))
    model(x, x)[1].backward()
    assert model.decoder.layers[0].ff.gate.weight.grad.abs().sum() > 0


def test_the_bias_update_lowers_the_loaded_and_raises_the_idle_and_only_after_training_steps():
    experts = layer(dataclasses.replace(SPECS["mixtral"], bias_rate=0.25))
    x = tokens(30).unsqueeze(0)
    experts.eval()(x)
    experts.after_step()
    assert torch.equal(experts.score_bias, torch.zeros(4, dtype=torch.float64))  # eval forwards count nothing
    experts.train()(x)
    loads = experts.loads.double()
    experts.after_step()
    torch.testing.assert_close(experts.score_bias, 0.25 * torch.sign(loads.mean() - loads))
    experts.after_step()  # nothing new since: no move
    torch.testing.assert_close(experts.score_bias, 0.25 * torch.sign(loads.mean() - loads))


def test_training_with_the_bias_update_evens_the_loads_of_a_router_that_prefers_one_expert():
    experts = layer(dataclasses.replace(SPECS["mixtral"], top_k=1, bias_rate=0.01, aux_loss=0.0)).train()
    with torch.no_grad():
        experts.gate.weight[0] += 0.3  # expert 0 wins for every (positive) token
    x = tokens(200).abs().unsqueeze(0)
    experts(x)
    assert experts.loads.tolist() == [200, 0, 0, 0]
    for _ in range(100):
        experts(x)
        experts.after_step()
    experts(x)
    assert experts.loads.max() <= 60  # about a quarter each; the weights never moved
    assert experts.score_bias[0] < 0 < experts.score_bias[1:].min()


def _bias_worker(rank, world_size, init_file, out_dir):
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    try:
        experts = layer(dataclasses.replace(SPECS["mixtral"], bias_rate=0.25)).train()
        experts(tokens(30, seed=10 + rank).unsqueeze(0))  # each process its own tokens
        experts.after_step()
        torch.save(experts.score_bias, f"{out_dir}/bias{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_under_data_parallel_every_process_moves_its_biases_by_the_summed_loads(tmp_path):
    import torch.multiprocessing as mp

    mp.spawn(_bias_worker, args=(2, str(tmp_path / "init"), str(tmp_path)), nprocs=2, join=True)
    biases = [torch.load(tmp_path / f"bias{r}.pt") for r in range(2)]
    loads = torch.zeros(4, dtype=torch.float64)
    for rank in range(2):  # each process's loads, computed alone
        alone = layer(SPECS["mixtral"]).train()
        alone(tokens(30, seed=10 + rank).unsqueeze(0))
        loads += alone.loads.double()
    assert torch.equal(biases[0], biases[1])  # the same move on every process ...
    torch.testing.assert_close(biases[0], 0.25 * torch.sign(loads.mean() - loads))  # ... by the summed loads


def test_active_parameters_leave_out_the_experts_a_token_does_not_use():
    torch.manual_seed(0)
    model = tl.GPT(tl.GPTConfig(20, 16, 2, 2, 16, recipe="experts", experts={"n_experts": 6, "top_k": 2}))
    per_expert = 3 * 16 * model.decoder.layers[0].ff.d_expert
    total = sum(p.numel() for p in model.parameters())
    assert active_parameters(model) == total - 2 * 4 * per_expert


def test_the_first_dense_layers_and_the_per_layer_recipe():
    recipe = tl.as_recipe("experts", experts={"n_experts": 4, "dense_layers": 2})
    dense = [recipe.for_layer(i).ffn.kind != "experts" for i in range(4)]
    assert dense == [True, True, False, False]
    hybrid = tl.as_recipe(recipe, attention="gated_delta", full_every=2)
    layers = [(hybrid.for_layer(i).attention.kind, hybrid.for_layer(i).ffn.kind != "experts") for i in range(4)]
    assert layers == [("gated_delta", True), ("multi_head", True), ("gated_delta", False), ("multi_head", False)]


def test_a_checkpoints_dict_and_the_command_lines_flat_settings_give_the_same_recipe():
    config = tl.GPTConfig(20, 16, 2, 2, 16, recipe="experts", experts={"n_experts": 4, "score": "sigmoid"})
    assert tl.GPTConfig(**config.to_dict()).recipe == config.recipe
    assert tl.GPTConfig(**config.settings()).recipe == config.recipe
    dense = tl.GPTConfig(20, recipe="llama")
    assert dense.settings()["experts"] == 0 and tl.GPTConfig(**dense.settings()).recipe == dense.recipe


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"n_experts": 0}, "n_experts"),
        ({"n_experts": 4, "top_k": 5}, "top_k=5"),
        ({"score": "relu"}, "score"),
        ({"n_groups": 3}, "n_groups=3"),
        ({"n_groups": 4, "topk_groups": 5}, "topk_groups=5"),
        ({"n_groups": 8}, "two best"),
        ({"n_groups": 4, "topk_groups": 1, "top_k": 3}, "top_k=3"),
        ({"scaling": 0.0}, "scaling"),
        ({"aux_loss": -0.1}, "aux_loss"),
        ({"aux_loss": float("nan")}, "aux_loss"),
        ({"bias_rate": True}, "bias_rate"),
        ({"capacity": 0}, "capacity"),
        ({"norm_topk": 1}, "norm_topk"),
    ],
)
def test_a_bad_option_is_refused_by_name(options, message):
    with pytest.raises((ValueError, TypeError), match=message):
        ExpertsSpec(**options)


def test_bad_recipes_and_settings_are_refused_by_name():
    with pytest.raises(ValueError, match="ffn='swiglu'"):
        tl.GPTConfig(20, experts=ExpertsSpec())
    with pytest.raises(ValueError, match="unknown experts choice 'n_expert'"):
        spec_from_dict({"n_expert": 4})
    with pytest.raises(TypeError, match="ExpertsSpec"):
        spec_from_dict(8)
    with pytest.raises(ValueError, match="experts_top_k=4 is a choice of experts: give experts too"):
        spec_from_flat({"experts": 0, "experts_top_k": 4})
    assert spec_from_flat({"experts": 0, "experts_top_k": 2}) is None  # the default: nothing said
    with pytest.raises(ValueError, match="n_experts=4"):
        route(tokens(3, 5), ExpertsSpec(n_experts=4))
    with pytest.raises(ValueError, match="d_model=12"):
        layer(SPECS["mixtral"])(tokens(3, 7))
