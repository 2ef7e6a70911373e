"""The chapter "Today's block" checks accept right answers and reject plausible wrong ones with the right message."""

import pytest
import torch
import torch.nn.functional as F
from _exercise_cases import FIELDS, Table, assert_verdict, case, stub

import transformer_lib as tl
from transformer_lib.exercises import todays_block

RMS, SWIGLU = todays_block.check_rms_norm, todays_block.check_swiglu
CASES = Table()


@CASES.add(RMS, "passed")
def rms_model_answer(x, weight, eps):
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


@CASES.add(RMS, "passed")
def rms_rsqrt(x, weight, eps):
    return x * torch.rsqrt(x.square().mean(dim=-1, keepdim=True) + eps) * weight


@CASES.add(RMS, "failed", "LayerNorm")
def rms_layer_norm(x, weight, eps):
    return F.layer_norm(x, (x.shape[-1],), weight, None, eps)


@CASES.add(RMS, "failed", "square root")
def rms_no_sqrt(x, weight, eps):
    return x / (x.pow(2).mean(-1, keepdim=True) + eps) * weight


@CASES.add(RMS, "failed", "eps after the square root")
def rms_eps_outside(x, weight, eps):
    return x / (x.pow(2).mean(-1, keepdim=True).sqrt() + eps) * weight


@CASES.add(RMS, "failed", "forgot the weight")
def rms_no_weight(x, weight, eps):
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)


@CASES.add(RMS, "failed", "over the first axis")
def rms_axis0(x, weight, eps):
    return x / torch.sqrt(x.pow(2).mean(0, keepdim=True) + eps) * weight


@CASES.add(RMS, "failed", "standard deviation")
def rms_std(x, weight, eps):
    return x / torch.sqrt(x.std(-1, keepdim=True) ** 2 + eps) * weight


@CASES.add(RMS, "failed", "dtype")
def rms_float32(x, weight, eps):
    return rms_model_answer(x, weight, eps).float()


@CASES.add(RMS, "failed", "in place")
def rms_in_place(x, weight, eps):
    return x.mul_(torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)).mul_(weight)


@CASES.add(SWIGLU, "passed")
def swiglu_model_answer(x, w_gate, w_up, w_down):
    return (F.silu(x @ w_gate.T) * (x @ w_up.T)) @ w_down.T


@CASES.add(SWIGLU, "passed")
def swiglu_linear(x, w_gate, w_up, w_down):
    return F.linear(F.silu(F.linear(x, w_gate)) * F.linear(x, w_up), w_down)


@CASES.add(SWIGLU, "failed", "SiLU on the up projection")
def swiglu_swapped(x, w_gate, w_up, w_down):
    return ((x @ w_gate.T) * F.silu(x @ w_up.T)) @ w_down.T


@CASES.add(SWIGLU, "failed", "sigmoid")
def swiglu_sigmoid(x, w_gate, w_up, w_down):
    return (torch.sigmoid(x @ w_gate.T) * (x @ w_up.T)) @ w_down.T


@CASES.add(SWIGLU, "failed", "left out the up projection")
def swiglu_no_up(x, w_gate, w_up, w_down):
    return F.silu(x @ w_gate.T) @ w_down.T


@CASES.add(SWIGLU, "failed", "ReLU")
def swiglu_relu(x, w_gate, w_up, w_down):
    return (torch.relu(x @ w_gate.T) * (x @ w_up.T)) @ w_down.T


@CASES.add(SWIGLU, "failed", "added the two branches")
def swiglu_sum(x, w_gate, w_up, w_down):
    return (F.silu(x @ w_gate.T) + x @ w_up.T) @ w_down.T


@CASES.add(SWIGLU, "failed", "has shape")
def swiglu_no_down(x, w_gate, w_up, w_down):
    return F.silu(x @ w_gate.T) * (x @ w_up.T)


def test_the_library_passes_its_own_checks():
    def library_rms(x, weight, eps):
        norm = tl.RMSNorm(x.shape[-1], eps=eps).to(x.dtype)
        with torch.no_grad():
            norm.weight.copy_(weight)
            return norm(x)

    def library_swiglu(x, w_gate, w_up, w_down):
        net = tl.SwiGLU(x.shape[-1], w_gate.shape[0]).to(x.dtype)
        with torch.no_grad():
            net.gate_proj.weight.copy_(w_gate)
            net.up_proj.weight.copy_(w_up)
            net.down_proj.weight.copy_(w_down)
            return net(x)

    assert RMS(library_rms, verbose=False)
    assert SWIGLU(library_swiglu, verbose=False)


STUB_CASES = [case(RMS, stub, "not implemented"), case(SWIGLU, stub, "not implemented")]


@pytest.mark.parametrize(FIELDS, CASES + STUB_CASES)
def test_verdict(check, fn, status, phrases):
    assert_verdict(check, fn, status, phrases)
