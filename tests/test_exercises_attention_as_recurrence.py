"""The chapter "Attention as a recurrence" checks accept right answers and reject plausible wrong ones with the right
message."""

import math

import pytest
import torch
from _exercise_cases import FIELDS, Table, assert_verdict, case, stub

import transformer_lib as tl
from transformer_lib.exercises import attention_as_recurrence

LINEAR, DELTA = attention_as_recurrence.check_causal_linear_attention, attention_as_recurrence.check_delta_write
CASES = Table()


# --- exercise 1 of chapter "Attention as a recurrence": causal linear attention, the plain form
# -----------------------------------


def _scores(q, k, keep=0, upper=False):
    """``q k^T`` with a triangle kept: the lower one from diagonal ``keep`` (or the upper one)."""
    s = q @ k.transpose(-1, -2)
    return s.triu() if upper else s.tril(keep)


@CASES.add(LINEAR, "passed")
def linear_model_answer(q, k, v):
    T = q.shape[-2]
    lower = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    scores = (q @ k.transpose(-1, -2)).masked_fill(~lower, 0)
    return scores @ v


@CASES.add(LINEAR, "passed")
def linear_running_state(q, k, v):
    state = q.new_zeros(*q.shape[:-2], q.shape[-1], v.shape[-1])  # (..., d_k, d_v)
    outs = []
    for t in range(q.shape[-2]):
        state = state + k[..., t, :, None] * v[..., t, None, :]  # + k_t v_t^T
        outs.append((q[..., t, None, :] @ state).squeeze(-2))  # q_t S
    return torch.stack(outs, dim=-2)


@CASES.add(LINEAR, "passed")
def linear_cumsum_einsum(q, k, v):
    states = torch.einsum("...td,...te->...tde", k, v).cumsum(dim=-3)  # S_t for every t
    return torch.einsum("...td,...tde->...te", q, states)


@CASES.add(LINEAR, "failed", "forgot the causal mask", "a running sum is the mask")
def linear_no_mask(q, k, v):
    return q @ k.transpose(-1, -2) @ v


@CASES.add(LINEAR, "failed", "strict past (s < t)", "tril not tril(-1)")
def linear_strict_past(q, k, v):
    return _scores(q, k, keep=-1) @ v


@CASES.add(LINEAR, "failed", "kept the future")
def linear_upper_triangle(q, k, v):
    return _scores(q, k, upper=True) @ v


@CASES.add(LINEAR, "failed", "added a softmax;", "plain form")
def linear_softmax(q, k, v):
    T = q.shape[-2]
    future = torch.ones(T, T, dtype=torch.bool).triu(1)
    return torch.softmax((q @ k.transpose(-1, -2)).masked_fill(future, float("-inf")), dim=-1) @ v


@CASES.add(LINEAR, "failed", "a softmax and a 1/sqrt(d_k) scale")
def linear_softmax_scaled(q, k, v):
    T = q.shape[-2]
    future = torch.ones(T, T, dtype=torch.bool).triu(1)
    scores = (q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])).masked_fill(future, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


@CASES.add(LINEAR, "failed", "scaled the scores by 1/sqrt(d_k)")
def linear_scaled(q, k, v):
    return _scores(q, k) / math.sqrt(q.shape[-1]) @ v


@CASES.add(LINEAR, "failed", "divided each row by its sum")
def linear_row_normalised(q, k, v):
    s = _scores(q, k)
    return s / s.sum(-1, keepdim=True) @ v


@CASES.add(LINEAR, "failed", "swapped the roles of k and v")
def linear_state_transposed(q, k, v):
    state = q.new_zeros(*q.shape[:-2], v.shape[-1], q.shape[-1])  # v k^T: (d_v, d_k)
    outs = []
    for t in range(q.shape[-2]):
        state = state + v[..., t, :, None] * k[..., t, None, :]
        outs.append((q[..., t, None, :] @ state).squeeze(-2))
    return torch.stack(outs, dim=-2)


@CASES.add(LINEAR, "failed", "your function raised RuntimeError", "d_k rows")
def linear_square_state(q, k, v):
    state = q.new_zeros(*q.shape[:-2], q.shape[-1], q.shape[-1])  # (d_k, d_k): v's width forgotten
    outs = []
    for t in range(q.shape[-2]):
        state = state + k[..., t, :, None] * v[..., t, None, :]
        outs.append((q[..., t, None, :] @ state).squeeze(-2))
    return torch.stack(outs, dim=-2)


@CASES.add(LINEAR, "failed", "has shape (4, 5)", "(..., T, d_v) = (5, 4)")
def linear_output_transposed(q, k, v):
    return (_scores(q, k) @ v).transpose(-1, -2)


@CASES.add(LINEAR, "failed", "dtype torch.float32; keep the inputs' dtype torch.float64")
def linear_float32(q, k, v):
    return linear_model_answer(q.float(), k.float(), v.float())


@CASES.add(LINEAR, "failed", "NaN or inf", "with 0, not -inf")
def linear_minus_inf_mask(q, k, v):
    T = q.shape[-2]
    future = torch.ones(T, T, dtype=torch.bool).triu(1)
    return (q @ k.transpose(-1, -2)).masked_fill(future, float("-inf")) @ v  # -inf, the softmax habit


@CASES.add(LINEAR, "failed", "changed q, k or v in place")
def linear_output_into_v(q, k, v):
    state = q.new_zeros(*q.shape[:-2], q.shape[-1], v.shape[-1])
    for t in range(q.shape[-2]):
        state = state + k[..., t, :, None] * v[..., t, None, :]  # reads v_t before overwriting it
        v[..., t, :] = (q[..., t, None, :] @ state).squeeze(-2)
    return v


@CASES.add(LINEAR, "failed", "for q, k of shape (T, d_k) = (5, 4)", "out[0] should be")
def linear_doubled(q, k, v):
    return 2 * linear_model_answer(q, k, v)


# --- exercise 2 of chapter "Attention as a recurrence": one write of the delta rule
# ------------------------------------------------


@CASES.add(DELTA, "passed")
def delta_model_answer(state, k, v, beta):
    read = (state * k[..., :, None]).sum(-2)  # S^T k, (..., d_v)
    error = v - read
    return state + beta[..., None, None] * k[..., :, None] * error[..., None, :]


@CASES.add(DELTA, "passed")
def delta_matmul(state, k, v, beta):
    read = (k.unsqueeze(-2) @ state).squeeze(-2)  # (..., 1, d_k) @ (..., d_k, d_v)
    write = torch.einsum("...k,...v->...kv", k, beta.unsqueeze(-1) * (v - read))
    return state + write


@CASES.add(DELTA, "failed", "plain linear-attention write", "writes v whole", "v - S^T k", "With beta = 1")
def delta_plain_write(state, k, v, beta):
    return state + beta[..., None, None] * k[..., :, None] * v[..., None, :]


@CASES.add(DELTA, "failed", "a sign is wrong", "With beta = 1")
def delta_sign(state, k, v, beta):
    read = (state * k[..., :, None]).sum(-2)
    return state + beta[..., None, None] * k[..., :, None] * (v + read)[..., None, :]


@CASES.add(DELTA, "failed", "for a batch of 3 square states", "left beta out", "full write every time")
def delta_no_beta(state, k, v, beta):
    read = (state * k[..., :, None]).sum(-2)
    return state + k[..., :, None] * (v - read)[..., None, :]


@CASES.add(DELTA, "failed", "beta scales the whole error")
def delta_beta_on_v(state, k, v, beta):
    read = (state * k[..., :, None]).sum(-2)
    return state + k[..., :, None] * (beta[..., None] * v - read)[..., None, :]


@CASES.add(DELTA, "failed", "you read S k where the state holds S^T k")
def delta_reads_s_k(state, k, v, beta):
    read = (state @ k.unsqueeze(-1)).squeeze(-1)  # S k: a shape error unless d_k == d_v
    return state + beta[..., None, None] * k[..., :, None] * (v - read)[..., None, :]


@CASES.add(DELTA, "failed", "outer product transposed, (v - S^T k) k^T")
def delta_outer_transposed(state, k, v, beta):
    read = (state * k[..., :, None]).sum(-2)
    return state + beta[..., None, None] * (v - read)[..., :, None] * k[..., None, :]


@CASES.add(DELTA, "failed", "read S k and wrote the outer product transposed")
def delta_both_transposed(state, k, v, beta):
    read = (state @ k.unsqueeze(-1)).squeeze(-1)
    return state + beta[..., None, None] * (v - read)[..., :, None] * k[..., None, :]


@CASES.add(DELTA, "failed", "for a batch of 3 square states", "raised RuntimeError", "two new axes")
def delta_beta_one_axis(state, k, v, beta):
    read = (state * k[..., :, None]).sum(-2)
    return state + beta[..., None] * (k[..., :, None] * (v - read)[..., None, :])


@CASES.add(DELTA, "failed", "changed state, k, v or beta in place", "return state + ...")
def delta_in_place(state, k, v, beta):
    read = (state * k[..., :, None]).sum(-2)
    state += beta[..., None, None] * k[..., :, None] * (v - read)[..., None, :]
    return state


@CASES.add(DELTA, "failed", "for float64 states", "dtype torch.float32; keep the state's dtype torch.float64")
def delta_float32(state, k, v, beta):
    return delta_model_answer(state.float(), k.float(), v.float(), beta.float())


@CASES.add(DELTA, "failed", "the new state has shape (4,)")
def delta_returns_the_read(state, k, v, beta):
    new = delta_model_answer(state, k, v, beta)
    return (new * k[..., :, None]).sum(-2)  # new_state^T k instead of the state


def test_beta_one_gives_back_v_exactly():
    g = torch.Generator().manual_seed(0)
    state, v = torch.randn(5, 3, generator=g, dtype=torch.float64), torch.randn(3, generator=g, dtype=torch.float64)
    k = torch.randn(5, generator=g, dtype=torch.float64)
    k = k / k.norm()
    new = delta_model_answer(state, k, v, torch.tensor(1.0, dtype=torch.float64))
    assert torch.allclose(new.T @ k, v)


def test_the_library_passes_its_own_checks():
    def library_linear(q, k, v):
        *lead, T, d_k = q.shape
        flat = lambda x: x.reshape(1, -1, T, x.shape[-1])  # noqa: E731
        out, _ = tl.linear_attention(flat(q), flat(k), flat(v))
        return out.reshape(*lead, T, v.shape[-1])

    def library_delta(state, k, v, beta):
        *lead, d_k, d_v = state.shape
        n = math.prod(lead)
        q = torch.zeros(1, n, 1, d_k, dtype=k.dtype)
        _, new = tl.delta_rule(
            q, k.reshape(1, n, 1, d_k), v.reshape(1, n, 1, d_v), beta.reshape(1, n, 1),
            initial_state=state.reshape(1, n, d_k, d_v),
        )  # fmt: skip
        return new.reshape(state.shape)

    assert LINEAR(library_linear, verbose=False)
    assert DELTA(library_delta, verbose=False)


STUB_CASES = [case(LINEAR, stub, "not implemented"), case(DELTA, stub, "not implemented")]


@pytest.mark.parametrize(FIELDS, CASES + STUB_CASES)
def test_verdict(check, fn, status, phrases):
    assert_verdict(check, fn, status, phrases)
