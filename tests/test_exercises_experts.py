"""The checks of the chapter "Experts" accept right answers and reject plausible wrong ones with the right message."""

import pytest
import torch
import torch.nn.functional as F
from _exercise_cases import FIELDS, Table, assert_verdict, case, stub
from hypothesis import given, settings
from hypothesis import strategies as st

import transformer_lib as tl
from transformer_lib.exercises import experts

ROUTE, LOSS = experts.check_route, experts.check_balancing_loss
CASES = Table()
FIRST_ROUTE = "for 3 tokens, 4 experts, k = 2"  # the smallest case; every named mistake fails there
BALANCED = "for a perfectly balanced router"


# --- exercise 1 of chapter "Experts": the router's choice and weights --------------------------------------------


def _renormalised(values):
    return values / values.sum(-1, keepdim=True)


@CASES.add(ROUTE, "passed")
def route_model_answer(logits, k):
    probs = logits.softmax(dim=-1)  # (N, E)
    values, chosen = probs.topk(k, dim=-1)  # (N, k) each
    return values / values.sum(-1, keepdim=True), chosen


@CASES.add(ROUTE, "passed")
def route_mixtral_order(logits, k):
    values, chosen = logits.topk(k, dim=-1)  # the top k of the logits are those of the probabilities
    return values.softmax(dim=-1), chosen  # a softmax over the k equals the renormalised probabilities


@CASES.add(ROUTE, "passed")
def route_slots_by_expert(logits, k):
    weights, chosen = route_model_answer(logits, k)
    order = chosen.argsort(dim=-1)  # the k slots in expert order, the same order in both
    return weights.gather(-1, order), chosen.gather(-1, order).int()


@CASES.add(ROUTE, "failed", FIRST_ROUTE, "softmax over the tokens (dim 0)", "token 0 (logits")
def route_softmax_over_tokens(logits, k):
    values, chosen = logits.softmax(dim=0).topk(k, dim=-1)
    return _renormalised(values), chosen


@CASES.add(ROUTE, "failed", FIRST_ROUTE, "softmax over the tokens (dim 0)")
def route_softmax_over_tokens_unnormalised(logits, k):
    return logits.softmax(dim=0).topk(k, dim=-1)


@CASES.add(ROUTE, "failed", FIRST_ROUTE, "left the weights unnormalised", "add up to 1")
def route_unnormalised(logits, k):
    values, chosen = logits.softmax(dim=-1).topk(k, dim=-1)
    return values, chosen


@CASES.add(ROUTE, "failed", FIRST_ROUTE, "weights from the logits")
def route_weights_from_logits(logits, k):
    values, chosen = logits.topk(k, dim=-1)
    return values, chosen


@CASES.add(ROUTE, "failed", FIRST_ROUTE, "weights from the logits")
def route_logits_renormalised(logits, k):
    values, chosen = logits.topk(k, dim=-1)
    return _renormalised(values), chosen


@CASES.add(ROUTE, "failed", FIRST_ROUTE, "chose the k smallest", "largest=True")
def route_smallest(logits, k):
    values, chosen = logits.softmax(dim=-1).topk(k, dim=-1, largest=False)
    return _renormalised(values), chosen


@CASES.add(ROUTE, "failed", FIRST_ROUTE, "chose the k smallest")
def route_smallest_by_sorting(logits, k):
    values, chosen = logits.softmax(dim=-1).sort(dim=-1)
    return values[:, :k], chosen[:, :k]


@CASES.add(ROUTE, "failed", FIRST_ROUTE, "the weights and chosen disagree", "any order")
def route_weights_reversed(logits, k):
    weights, chosen = route_model_answer(logits, k)
    return weights.flip(-1), chosen  # the slots of the weights reversed, not those of chosen


@CASES.add(ROUTE, "failed", "you returned (chosen, weights); return (weights, chosen)")
def route_pair_swapped(logits, k):
    weights, chosen = route_model_answer(logits, k)
    return chosen, weights


@CASES.add(ROUTE, "failed", "the weights have shape (3, 4); expected (3, 2)", "not every expert's")
def route_every_expert(logits, k):
    probs = logits.softmax(dim=-1)
    top = probs.topk(k, dim=-1)
    return probs, top.indices


@CASES.add(ROUTE, "failed", "chosen has shape (2, 3); expected (3, 2)")
def route_chosen_transposed(logits, k):
    weights, chosen = route_model_answer(logits, k)
    return weights, chosen.T


@CASES.add(ROUTE, "failed", "chosen has dtype torch.float32; expected an integer dtype", "topk's .indices")
def route_chosen_as_floats(logits, k):
    weights, chosen = route_model_answer(logits, k)
    return weights, chosen.float()


@CASES.add(ROUTE, "failed", "for float64 logits", "the weights have dtype torch.float32; expected torch.float64")
def route_float32(logits, k):
    return route_model_answer(logits.float(), k)


@CASES.add(ROUTE, "failed", FIRST_ROUTE, "token 0 is sent to the same expert twice", "k different ones")
def route_one_expert_twice(logits, k):
    weights, chosen = route_model_answer(logits, k)
    return weights, chosen[:, :1].expand(-1, k)


@CASES.add(ROUTE, "failed", "= 4 is not an expert", "0 to E-1 = 3")
def route_counting_from_one(logits, k):
    weights, chosen = route_model_answer(logits, k)
    return weights, chosen + 1


@CASES.add(ROUTE, "failed", "for logits near 100", "NaN or inf", "torch.softmax")
def route_unguarded_exp(logits, k):
    e = logits.exp()
    values, chosen = (e / e.sum(-1, keepdim=True)).topk(k, dim=-1)
    return _renormalised(values), chosen


@CASES.add(ROUTE, "failed", "changed the logits in place", "logits.softmax(-1)")
def route_in_place(logits, k):
    probs = logits.exp_()
    probs /= probs.sum(-1, keepdim=True)
    values, chosen = probs.topk(k, dim=-1)
    return _renormalised(values), chosen


@CASES.add(ROUTE, "failed", "your function returned a Tensor; return a pair (weights, chosen)")
def route_weights_only(logits, k):
    return route_model_answer(logits, k)[0]


@CASES.add(ROUTE, "failed", FIRST_ROUTE, "raised RuntimeError", "dim=-1")
def route_topk_over_tokens(logits, k):
    values, chosen = logits.softmax(dim=-1).topk(logits.shape[0] + 1, dim=0)  # k larger than N: a crash
    return values, chosen


@CASES.add(ROUTE, "failed", FIRST_ROUTE, "should go to experts", "with weights")
def route_halved(logits, k):
    weights, chosen = route_model_answer(logits, k)
    return weights / 2, chosen


def test_route_accepts_any_order_of_the_slots():
    """Permuting each token's k slots, the same way in weights and chosen, keeps a right answer right."""

    @given(st.integers(0, 2**31 - 1))
    @settings(max_examples=25, deadline=None, derandomize=True)
    def permuted_slots_pass(seed):
        g = torch.Generator().manual_seed(seed)

        def shuffled(logits, k):
            weights, chosen = route_model_answer(logits, k)
            order = torch.stack([torch.randperm(k, generator=g) for _ in range(len(logits))])  # (N, k)
            return weights.gather(-1, order), chosen.gather(-1, order)

        assert ROUTE(shuffled, verbose=False)

    permuted_slots_pass()


def test_qwen3_moes_router_passes_and_without_renormalising_is_named():
    qwen3_moe = pytest.importorskip("transformers.models.qwen3_moe.modeling_qwen3_moe")
    from transformers import Qwen3MoeConfig

    def router(norm):
        def fn(logits, k):
            E = logits.shape[1]
            config = Qwen3MoeConfig(hidden_size=E, num_experts=E, num_experts_per_tok=k, norm_topk_prob=norm)
            gate = qwen3_moe.Qwen3MoeTopKRouter(config).to(logits.dtype)
            with torch.no_grad():
                gate.weight.copy_(torch.eye(E))  # the hidden states are the logits
            _, weights, chosen = gate(logits)
            return weights, chosen

        return fn

    assert ROUTE(router(True), verbose=False)
    result = ROUTE(router(False), verbose=False)
    assert "left the weights unnormalised" in result.message, result.message


# --- exercise 2 of chapter "Experts": the Switch Transformer's load-balancing loss -------------------------------


def _counts(chosen, E):
    return torch.bincount(chosen.flatten(), minlength=E)


@CASES.add(LOSS, "passed")
def loss_model_answer(scores, chosen):
    (N, E), k = scores.shape, chosen.shape[1]
    f = _counts(chosen, E).to(scores.dtype) / (N * k)  # (E,) shares of the N k assignments
    P = scores.mean(dim=0)  # (E,) mean scores
    return E * (f * P).sum()


@CASES.add(LOSS, "passed")
def loss_one_hot(scores, chosen):
    E = scores.shape[1]
    f = F.one_hot(chosen, E).to(scores.dtype).mean(dim=(0, 1))  # a mean over tokens and slots
    return E * torch.dot(f, scores.mean(dim=0))


@CASES.add(LOSS, "passed")
def loss_library(scores, chosen):
    return tl.load_balancing_loss(scores, chosen)


@CASES.add(LOSS, "failed", BALANCED, "you counted per token", "counts / (N k)", "scores 1, got 2")
def loss_per_token(scores, chosen):
    (N, E) = scores.shape
    return E * (_counts(chosen, E).to(scores.dtype) / N * scores.mean(dim=0)).sum()


@CASES.add(LOSS, "failed", BALANCED, "you counted per token")
def loss_library_transformers_convention(scores, chosen):
    return tl.load_balancing_loss(scores, chosen, balanced="k")


@CASES.add(LOSS, "failed", BALANCED, "the factor E is missing", "scores 1, got 0.25")
def loss_without_e(scores, chosen):
    return loss_model_answer(scores, chosen) / scores.shape[1]


@CASES.add(LOSS, "failed", BALANCED, "P_i from the chosen experts' weights only", "scores.mean(dim=0)")
def loss_p_from_chosen(scores, chosen):
    (N, E), k = scores.shape, chosen.shape[1]
    picked = torch.zeros_like(scores).scatter(1, chosen, scores.gather(1, chosen))  # (N, E): chosen scores only
    f = _counts(chosen, E).to(scores.dtype) / (N * k)
    return E * (f * picked.mean(dim=0)).sum()


@CASES.add(LOSS, "failed", BALANCED, "P_i from the chosen experts' weights only", "got 1.2")
def loss_p_over_the_choosers(scores, chosen):
    (N, E), k = scores.shape, chosen.shape[1]
    picked = torch.zeros_like(scores).scatter(1, chosen, scores.gather(1, chosen))
    counts = _counts(chosen, E).to(scores.dtype)
    P = picked.sum(dim=0) / counts.clamp(min=1)  # the mean over the tokens that chose each expert
    return E * (counts / (N * k) * P).sum()


@CASES.add(LOSS, "failed", "for an expert that no token chose", "NaN or inf", "never by its own count")
def loss_shares_per_expert(scores, chosen):
    (N, E), k = scores.shape, chosen.shape[1]
    counts = _counts(chosen, E).to(scores.dtype)
    P = scores.sum(dim=0) / counts * counts / N  # right, but inf * 0 for an expert that nobody chose
    return E * (counts / (N * k) * P).sum()


@CASES.add(LOSS, "failed", BALANCED, "raw counts as f_i", "divided by N k")
def loss_raw_counts(scores, chosen):
    E = scores.shape[1]
    return E * (_counts(chosen, E).to(scores.dtype) * scores.mean(dim=0)).sum()


@CASES.add(LOSS, "failed", BALANCED, "requires_grad is False", "no gradient reaches the scores", "f_i comes from")
def loss_detached(scores, chosen):
    return loss_model_answer(scores.detach(), chosen)


@CASES.add(LOSS, "failed", BALANCED, "returned float 1", "no gradient reaches the scores", ".item()")
def loss_item(scores, chosen):
    return loss_model_answer(scores, chosen).item()


@CASES.add(LOSS, "failed", BALANCED, "requires_grad is False", "torch.tensor(...)")
def loss_rebuilt(scores, chosen):
    return torch.tensor(loss_model_answer(scores, chosen).tolist(), dtype=scores.dtype)


@CASES.add(LOSS, "failed", BALANCED, "requires_grad is False")
def loss_no_grad(scores, chosen):
    with torch.no_grad():
        return loss_model_answer(scores, chosen)


@CASES.add(LOSS, "failed", BALANCED, "the loss is right but its gradient is not", "E f_i / N", "[0.5, 0.5, 0.5, 0.5]")
def loss_gradient_doubled(scores, chosen):
    right = loss_model_answer(scores, chosen)
    return right + (right - right.detach())  # the same value, twice the gradient


@CASES.add(LOSS, "failed", BALANCED, "the loss value has shape (4,); expected ()", "summed over the experts")
def loss_not_summed(scores, chosen):
    (N, E), k = scores.shape, chosen.shape[1]
    return E * _counts(chosen, E).to(scores.dtype) / (N * k) * scores.mean(dim=0)


@CASES.add(
    LOSS,
    "failed",
    "for float64 scores",
    "the loss value has dtype torch.float32; expected torch.float64",
    ".to(scores.dtype)",
)
def loss_float32_counts(scores, chosen):
    (N, E), k = scores.shape, chosen.shape[1]
    return E * (_counts(chosen, E).float() / (N * k) * scores.mean(dim=0).float()).sum()


@CASES.add(LOSS, "failed", "changed scores or chosen in place", "build new tensors")
def loss_in_place(scores, chosen):
    (N, E), k = scores.shape, chosen.shape[1]
    return E * (_counts(chosen, E).to(scores.dtype) / (N * k) * scores.div_(N).sum(0)).sum()


@CASES.add(LOSS, "failed", BALANCED, "raised RuntimeError", "bincount")
def loss_float_one_hot(scores, chosen):
    return F.one_hot(chosen.float(), scores.shape[1]).sum()  # one_hot needs integer indices


def test_transformers_load_balancing_loss_counts_per_token():
    """transformers' load_balancing_loss_func is the per-token convention: the check names it so."""
    mixtral = pytest.importorskip("transformers.models.mixtral.modeling_mixtral")

    def transformers_loss(scores, chosen):
        E, k = scores.shape[1], chosen.shape[1]
        return mixtral.load_balancing_loss_func((scores.log(),), E, k)  # its softmax gives the scores back

    result = LOSS(transformers_loss, verbose=False)
    assert "you counted per token" in result.message and "scores 1, got 2" in result.message, result.message


@pytest.mark.parametrize("n_tokens", [4, 8, 12])
def test_a_perfectly_balanced_router_scores_one(n_tokens):
    E, k = 4, 2
    chosen = torch.arange(n_tokens * k).remainder(E).view(n_tokens, k)  # every expert chosen equally
    scores = torch.full((n_tokens, E), 1 / E, dtype=torch.float64)
    assert torch.allclose(loss_model_answer(scores, chosen), torch.tensor(1.0, dtype=torch.float64))
    assert torch.allclose(loss_per_token(scores, chosen), torch.tensor(float(k), dtype=torch.float64))


# --- both: stubs, and checks that never raise --------------------------------------------------

STUB_CASES = [case(ROUTE, stub, "not implemented"), case(LOSS, stub, "not implemented")]


@pytest.mark.parametrize(FIELDS, CASES + STUB_CASES)
def test_verdict(check, fn, status, phrases):
    assert_verdict(check, fn, status, phrases)


def test_every_named_mistake_has_a_case():
    """Each mistake the brief names is a row above, so that its words are tested."""
    ids = {p.id for p in CASES}
    for name in ["softmax_over_tokens", "unnormalised", "weights_from_logits", "smallest", "every_expert"]:
        assert f"check_route-route_{name}" in ids
    for name in ["per_token", "without_e", "p_from_chosen", "raw_counts", "detached"]:
        assert f"check_balancing_loss-loss_{name}" in ids


_DTYPES = [torch.float32, torch.float64, torch.int64, torch.bool]
_junk_tensor = st.builds(
    lambda shape, dtype, fill: torch.full(shape, fill).to(dtype),
    st.lists(st.integers(0, 5), max_size=3).map(tuple),
    st.sampled_from(_DTYPES),
    st.sampled_from([0.0, 1.0, -3.0, 7.0, float("nan")]),
)
_junk = st.one_of(
    st.none(),
    st.integers(-3, 3),
    st.floats(allow_nan=True),
    st.text(max_size=3),
    _junk_tensor,
    st.tuples(_junk_tensor, _junk_tensor),
    st.lists(_junk_tensor, max_size=3),
)


@pytest.mark.parametrize("check", [ROUTE, LOSS], ids=["route", "balancing_loss"])
def test_checks_never_raise_whatever_the_function_returns(check):
    @given(_junk)
    @settings(max_examples=60, deadline=None, derandomize=True)
    def judged(value):
        result = check(lambda *args: value, verbose=False)
        assert result.status in ("failed", "error") and not result, result.message
        assert "\n" not in result.message

    judged()


@pytest.mark.parametrize("check", [ROUTE, LOSS], ids=["route", "balancing_loss"])
@pytest.mark.parametrize("error", [ValueError("no"), IndexError("out"), ZeroDivisionError()], ids=type)
def test_checks_never_raise_whatever_the_function_raises(check, error):
    def crash(*args):
        raise error

    result = check(crash, verbose=False)
    assert result.status in ("failed", "error") and f"raised {type(error).__name__}" in result.message
