"""Tests of transformer_lib/long_context.py (chapter "Generation"): the online softmax equals the softmax, and
tiled attention equals PyTorch's fused attention in its output and in its gradients, while its
peak memory grows linearly with the sequence length where the naive path's grows quadratically."""

import math

import pytest
import torch
import torch.nn.functional as F
from _gpu import requires_cuda

import transformer_lib as tl

pytestmark = pytest.mark.usefixtures("one_thread")


def qkv(B, h, T_q, T_k, d=8, d_v=None, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    shapes = [(B, h, T_q, d), (B, h, T_k, d), (B, h, T_k, d_v or d)]
    return [torch.randn(*s, generator=g).to(dtype).requires_grad_() for s in shapes]


def grads(out, inputs, seed=1):
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed)).to(out)  # its dtype and device
    return torch.autograd.grad(out, inputs, g)


# ---------------------------------------------------------------- online softmax


@pytest.mark.parametrize("block_size", [1, 3, 8, 64, 100])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_online_softmax_equals_softmax(block_size, dtype, gen):
    x = (torch.randn(3, 5, 64, generator=gen) * 10).to(dtype)  # large scores: the running max matters
    tol = dict(rtol=1e-12, atol=1e-14) if dtype == torch.float64 else dict(rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(tl.online_softmax(x, block_size), torch.softmax(x, dim=-1), **tol)


def test_online_softmax_survives_scores_that_overflow_a_naive_exp():
    x = torch.tensor([[1000.0, 1001.0, 999.0, 1002.0, -1000.0]])
    assert torch.isinf(torch.exp(x)).any()  # the naive exp overflows
    torch.testing.assert_close(tl.online_softmax(x, 2), torch.softmax(x, dim=-1))


def test_online_softmax_with_a_first_block_of_minus_infinity():
    # a block with only -inf must not turn the running sum into NaN (-inf - -inf)
    x = torch.randn(2, 10, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    x[:, :4] = -math.inf
    y = tl.online_softmax(x, 4)
    assert torch.isfinite(y).all()
    torch.testing.assert_close(y, torch.softmax(x, dim=-1))
    assert tl.online_softmax(torch.full((1, 5), -math.inf), 2).isnan().all()  # as torch.softmax


# ---------------------------------------------------------------- tiled attention


CASES = [  # B, h, T_q, T_k, block_size
    (1, 1, 16, 16, 4),
    (2, 3, 37, 37, 8),  # T not a multiple of the block
    (2, 2, 5, 5, 1),  # one position per block
    (1, 2, 20, 20, 64),  # one block larger than T
    (2, 1, 33, 33, 32),  # a last block of one position
]


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize(("B", "h", "T_q", "T_k", "block_size"), CASES)
def test_tiled_attention_equals_fused_attention_in_float64(B, h, T_q, T_k, block_size, is_causal):
    q, k, v = qkv(B, h, T_q, T_k)
    out = tl.tiled_attention(q, k, v, is_causal=is_causal, block_size=block_size)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    for mine, theirs in zip(grads(out, (q, k, v)), grads(ref, (q, k, v)), strict=True):
        torch.testing.assert_close(mine, theirs, rtol=1e-11, atol=1e-11)


@pytest.mark.parametrize("block_size", [1, 7, 16, 100])
@pytest.mark.parametrize(("T_q", "T_k"), [(9, 30), (30, 9), (1, 17)])
def test_tiled_attention_with_different_query_and_key_lengths(T_q, T_k, block_size):
    q, k, v = qkv(2, 2, T_q, T_k, d=8, d_v=5)  # d_v may differ from d, as in F.scaled_dot_product_attention
    out = tl.tiled_attention(q, k, v, block_size=block_size)
    ref = F.scaled_dot_product_attention(q, k, v)
    assert out.shape == (2, 2, T_q, 5)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    for mine, theirs in zip(grads(out, (q, k, v)), grads(ref, (q, k, v)), strict=True):
        torch.testing.assert_close(mine, theirs, rtol=1e-11, atol=1e-11)


@pytest.mark.parametrize("is_causal", [False, True])
def test_tiled_attention_equals_fused_attention_in_float32(is_causal):
    q, k, v = qkv(2, 4, 70, 70, d=16, dtype=torch.float32, seed=5)
    out = tl.tiled_attention(q, k, v, is_causal=is_causal, block_size=16)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
    for mine, theirs in zip(grads(out, (q, k, v)), grads(ref, (q, k, v)), strict=True):
        torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=1e-5)


def test_tiled_attention_in_bfloat16_keeps_float32_statistics():
    q, k, v = qkv(1, 2, 40, 40, d=16, dtype=torch.float32, seed=6)
    exact = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True)
    low = [t.detach().bfloat16() for t in (q, k, v)]
    out = tl.tiled_attention(*low, is_causal=True, block_size=8)
    assert out.dtype == torch.bfloat16
    # the only bfloat16 rounding left: the inputs and the output (relative step 2^-8)
    rounded = F.scaled_dot_product_attention(*[t.double() for t in low], is_causal=True)
    torch.testing.assert_close(out.double(), rounded, rtol=2**-7, atol=2**-7)
    assert (out.double() - exact).abs().max() < 0.05


def test_tiled_attention_passes_gradcheck():
    q, k, v = qkv(1, 2, 6, 6, d=3, seed=7)
    for is_causal in (False, True):
        assert torch.autograd.gradcheck(lambda a, b, c: tl.tiled_attention(a, b, c, is_causal=is_causal, block_size=4),
                                        (q, k, v))  # fmt: skip
    q, k, v = qkv(1, 1, 5, 7, d=2, seed=8)
    assert torch.autograd.gradcheck(lambda a, b, c: tl.tiled_attention(a, b, c, block_size=3), (q, k, v))


def test_causal_tiled_attention_never_looks_at_the_future():
    q, k, v = qkv(1, 2, 24, 24, seed=9)
    out = tl.tiled_attention(q, k, v, is_causal=True, block_size=5)
    k2, v2 = k.detach().clone(), v.detach().clone()
    k2[:, :, 13:] += 100.0  # change every key and value after position 12
    v2[:, :, 13:] -= 50.0
    out2 = tl.tiled_attention(q, k2, v2, is_causal=True, block_size=5)
    torch.testing.assert_close(out[:, :, :13], out2[:, :, :13], rtol=0, atol=0)
    assert not torch.allclose(out[:, :, 13:], out2[:, :, 13:])
    # and the gradient of an early output reaches no later key
    (dk,) = torch.autograd.grad(out[:, :, 6].sum(), k)
    assert dk[:, :, 7:].abs().max() == 0 and dk[:, :, :7].abs().max() > 0


def test_causal_mode_skips_the_blocks_above_the_diagonal(monkeypatch):
    from transformer_lib import long_context

    seen = []
    real = long_context._tile_scores

    def spy(q_blk, k_blk, i0, j0, *rest):
        seen.append((i0, j0))
        return real(q_blk, k_blk, i0, j0, *rest)

    monkeypatch.setattr(long_context, "_tile_scores", spy)
    q, k, v = qkv(1, 1, 20, 20)
    tl.tiled_attention(q, k, v, is_causal=True, block_size=5)
    assert sorted(seen) == [(i, j) for i in range(0, 20, 5) for j in range(0, i + 1, 5)]  # 10 of 16 tiles
    seen.clear()
    tl.tiled_attention(q, k, v, block_size=5)
    assert len(seen) == 16


# ---------------------------------------------------------------- peak memory


def test_peak_memory_sees_temporaries_freed_inside_a_python_function():
    # tiled attention allocates and frees small tiles in a Python loop: the probe must see the
    # output (T x d) plus some tiles, and neither nothing nor the sum of every tile ever made
    T, d, block = 256, 64, 32
    peak = tl.attention_peak_memory(T, method="tiled", d=d, block_size=block)
    out_bytes = T * d * 4
    assert out_bytes < peak < out_bytes + 40 * block * block * 4


def test_naive_memory_grows_as_t_squared_and_tiled_as_t():
    sizes = dict(d=64, block_size=32)
    peaks = {
        (method, backward, T): tl.attention_peak_memory(T, method=method, backward=backward, **sizes)
        for method in ("naive", "tiled")
        for backward in (False, True)
        for T in (256, 512)
    }
    for backward in (False, True):
        naive = peaks["naive", backward, 512] / peaks["naive", backward, 256]
        tiled = peaks["tiled", backward, 512] / peaks["tiled", backward, 256]
        assert 3.5 < naive < 4.5, (backward, naive)  # the (T, T) scores dominate
        assert 1.4 < tiled < 2.5, (backward, tiled)  # O(T) output and gradients, plus O(block^2) tiles
        assert peaks["tiled", backward, 512] < peaks["naive", backward, 512] / 4


def test_the_causal_naive_path_pays_for_its_mask_too():
    naive = tl.attention_peak_memory(128, method="naive", d=16, is_causal=True)
    assert naive >= 2 * 128 * 128 * 4 + 128 * 128  # scores, weights and a bool (T, T) mask
    assert tl.attention_peak_memory(128, method="fused", d=16, is_causal=True) < naive


def test_the_tiled_memory_benchmark_runs_and_reports_growth(capsys):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # benchmarks/ is a folder, not a package
    from benchmarks import tiled_memory

    result = tiled_memory.sweep([64, 128], d=16, block_size=16)
    assert set(result["peak"]) == {
        (p, m, T) for p in ("fwd", "fwdbwd") for m in tiled_memory.METHODS for T in (64, 128)
    }
    assert tiled_memory.growth(result, "fwd", "naive", 128) > 3
    assert "naive growth" in tiled_memory.report(result)
    assert tiled_memory.main(["--seq-lens", "32", "64", "--d", "8", "--block-size", "8", "--no-record"]) == 0
    assert "tiled MiB" in capsys.readouterr().out


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_tiled_attention_on_a_gpu_equals_fused_attention(dtype):
    q, k, v = (t.detach().to("cuda", dtype).requires_grad_() for t in qkv(2, 4, 300, 300, d=64, seed=10))
    out = tl.tiled_attention(q, k, v, is_causal=True, block_size=64)
    ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True)
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    assert out.dtype == dtype and (out.double() - ref).abs().max() < tol
    for mine, theirs in zip(grads(out, (q, k, v)), grads(ref, (q, k, v)), strict=True):
        assert (mine.double() - theirs.double()).abs().max() < 10 * tol
