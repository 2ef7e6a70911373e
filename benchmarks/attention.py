"""Attention's cost against the sequence length: the hand-written path, the fused one, and PyTorch's
kernel called directly.

Three ways to compute the same causal multi-head self-attention of ``x (B, T, d_model)``:

* ``handwritten``: ``tl.MultiHeadAttention(need_weights=True)``, which runs the library's
  :func:`tl.scaled_dot_product_attention` and builds the ``(B, h, T, T)`` score matrix;
* ``fused``: the same module with ``need_weights=False``, which calls
  :func:`torch.nn.functional.scaled_dot_product_attention` (no score matrix is kept);
* ``direct``: the module's own projections, then ``F.scaled_dot_product_attention`` on the
  projected ``q, k, v``, written out here with nothing else: what the library's fused path costs
  at least.

For each sequence length ``T`` it times the forward pass (under ``torch.no_grad``) and the
forward plus backward pass (gradients of the input and every parameter), taking turns between
the variants and reporting medians, and measures the peak memory of one call: on a GPU with
``torch.cuda.max_memory_allocated``; on the CPU from the allocations and frees that
``torch.profiler`` reports per operator (``profile_memory=True``). Beside them it reports the size of one
score matrix, ``B * h * T^2 * bytes per element``. The numbers go to ``attention_scaling.json``
and a log-log figure to ``attention_scaling.png`` (``attention_scaling_cuda.png`` for a GPU run).

Targets: ``fused / direct`` within 5% (0.95 to 1.05); the hand-written path's memory grows as
``T^2`` while the fused one grows as ``T``.

    python -m benchmarks.attention                      # CPU sweep, T = 64 ... 4096 (about 3 minutes)
    python -m benchmarks.attention --device cuda        # T = 64 ... 16384, float32 and bfloat16
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

import transformer_lib as tl

from .attention_report import JSON_FILE, PASSES, VARIANTS, _find, plot, report, save_json, summary  # noqa: F401
from .common import (
    HERE,
    add_record_flags,
    append_result,
    default_threads,
    median,
    set_threads,
    synchronize,
    time_call,
)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


# ---------------------------------------------------------------------------------------------
# The three variants
# ---------------------------------------------------------------------------------------------


def direct_attention(mha: tl.MultiHeadAttention, x: Tensor, causal: bool = True) -> Tensor:
    """The module's projections and ``F.scaled_dot_product_attention``, nothing else: ``(B, T, d_model)``."""
    B, T, d_model = x.shape
    h, d_k = mha.n_heads, mha.d_k
    q = mha.q_proj(x).view(B, T, h, d_k).transpose(1, 2)  # (B, h, T, d_k)
    k = mha.k_proj(x).view(B, T, h, d_k).transpose(1, 2)  # (B, h, T, d_k)
    v = mha.v_proj(x).view(B, T, h, d_k).transpose(1, 2)  # (B, h, T, d_k)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)  # (B, h, T, d_k)
    return mha.out_proj(out.transpose(1, 2).reshape(B, T, d_model))  # (B, T, d_model)


def attention_fn(variant: str, mha: tl.MultiHeadAttention, causal: bool = True) -> Callable[[Tensor], Tensor]:
    """``x (B, T, d_model) -> output (B, T, d_model)`` for one of :data:`VARIANTS`."""
    if variant == "handwritten":
        return lambda x: mha(x, x, x, need_weights=True, is_causal=causal)[0]
    if variant == "fused":
        return lambda x: mha(x, x, x, need_weights=False, is_causal=causal)[0]
    if variant == "direct":
        return lambda x: direct_attention(mha, x, causal)
    raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")


def make_call(fn: Callable[[Tensor], Tensor], x: Tensor, grad_out: Tensor, params: list[Tensor], pass_: str):
    """A no-argument callable running one pass of ``fn`` on ``x``."""
    if pass_ == "forward":

        def forward() -> None:
            with torch.no_grad():
                fn(x)

        return forward

    def forward_backward() -> None:
        out = fn(x)
        torch.autograd.grad(out, [x, *params], grad_out)  # gradients of the input and every parameter

    return forward_backward


# ---------------------------------------------------------------------------------------------
# Peak memory
# ---------------------------------------------------------------------------------------------


def peak_bytes(call: Callable[[], None], device: torch.device) -> int:
    """Peak bytes allocated during ``call()``: ``tl.peak_memory_bytes`` (public PyTorch APIs only)."""
    return tl.peak_memory_bytes(call, device)


# ---------------------------------------------------------------------------------------------
# The sweep
# ---------------------------------------------------------------------------------------------


def _is_oom(e: BaseException) -> bool:
    return isinstance(e, torch.OutOfMemoryError) or "out of memory" in str(e).lower()


def time_in_turns(
    calls: dict[str, Callable[[], None]], device: torch.device, budget_s: float, max_reps: int
) -> tuple[dict[str, float], dict[str, int], dict[str, str]]:
    """Median seconds per call of each of ``calls``, timed in turns (A B C, B C A, C A B, ...).

    One untimed warm-up call each sets how many timed calls fit in ``budget_s`` (at least 1, at
    most ``max_reps``). Returns ``(medians, repeats, failed)``; ``failed`` names the calls that
    ran out of memory (they are left out of the rest).
    """
    first, failed = {}, {}
    for v, call in calls.items():
        try:
            first[v] = time_call(call, device)
        except RuntimeError as e:
            if not _is_oom(e):
                raise
            failed[v] = "out of memory"
            if device.type == "cuda":
                torch.cuda.empty_cache()
    reps = {v: max(1, min(max_reps, int(budget_s / t))) for v, t in first.items()}
    times: dict[str, list[float]] = {v: [] for v in first}
    order = list(first)
    for i in range(max(reps.values(), default=0)):
        # rotate the order every turn, so no variant always runs right after the memory-hungry
        # hand-written one (whose freed buffers the next call pays to map again)
        for v in order[i % len(order) :] + order[: i % len(order)]:
            if i < reps[v]:
                times[v].append(time_call(calls[v], device))
    return {v: median(t) for v, t in times.items()}, reps, failed


def _inputs(B: int, T: int, d_model: int, seed: int, device: torch.device, dtype: torch.dtype) -> tuple:
    """``x (B, T, d_model)`` (requiring its gradient) and a gradient ``grad_out`` of the same shape."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, d_model, generator=g).to(device=device, dtype=dtype).requires_grad_()
    return x, torch.randn(B, T, d_model, generator=g).to(device=device, dtype=dtype)


def _skip_reason(
    v: str, pass_: str, T: int, last_time: dict, too_big: set, limit: int | None, max_call_s: float
) -> str | None:
    """Why variant ``v`` does not run ``pass_`` at length ``T`` (None: it runs)."""
    prev = last_time.get((v, pass_))
    if (v, pass_) in too_big:
        return "skipped: out of memory at a shorter length"
    if v == "handwritten" and pass_ != "forward" and limit is not None and T > limit:
        return f"skipped above T={limit} (--skip-handwritten-backward-above)"
    if prev is not None and prev[1] * (T / prev[0]) ** 2 > max_call_s:
        return f"skipped: one call would take about {prev[1] * (T / prev[0]) ** 2:.0f} s"
    return None


def sweep(
    seq_lens: list[int],
    batch_size: int = 1,
    d_model: int = 128,
    n_heads: int = 4,
    device: str = "cpu",
    dtypes: tuple[str, ...] = ("float32",),
    budget_s: float = 2.0,
    max_reps: int = 20,
    max_call_s: float = 30.0,
    skip_handwritten_backward_above: int | None = None,
    measure_memory: bool = True,
    causal: bool = True,
    seed: int = 0,
) -> dict:
    """Time (and measure the memory of) every variant, pass, dtype and length; returns a dict.

    ``rows`` holds one dict per (dtype, T, pass, variant) with ``time_s`` (median of ``reps``
    calls, taken in turns with the other variants), ``peak_bytes`` (one call; ``None`` when not
    measured), ``score_bytes`` (one ``(B, h, T, T)`` score matrix) and ``skipped`` (why a point
    was not run, else ``None``). Each variant gets about ``budget_s`` seconds of timed calls per
    point (at most ``max_reps``, at least one): fewer repeats at large ``T``. The
    hand-written backward is skipped above ``skip_handwritten_backward_above``, and any variant
    whose time at the previous length, scaled by ``(T / T_prev)^2``, predicts a call longer than
    ``max_call_s``.
    """
    device = torch.device(device)
    rows = []
    for dtype_name in dtypes:
        dtype = DTYPES[dtype_name]
        torch.manual_seed(seed)
        mha = tl.MultiHeadAttention(d_model, n_heads).to(device=device, dtype=dtype)
        params = list(mha.parameters())
        fns = {v: attention_fn(v, mha, causal) for v in VARIANTS}
        last_time: dict[tuple[str, str], tuple[int, float]] = {}  # (variant, pass) -> (T, seconds)
        too_big: set[tuple[str, str]] = set()  # (variant, pass) that ran out of memory
        for T in seq_lens:
            x, grad_out = _inputs(batch_size, T, d_model, seed + T, device, dtype)
            score_bytes = batch_size * n_heads * T * T * x.element_size()
            for pass_ in PASSES:
                limits = (skip_handwritten_backward_above, max_call_s)
                skipped = {v: _skip_reason(v, pass_, T, last_time, too_big, *limits) for v in VARIANTS}
                calls = {v: make_call(fns[v], x, grad_out, params, pass_) for v in VARIANTS if skipped[v] is None}
                medians, reps, failed = time_in_turns(calls, device, budget_s, max_reps)
                skipped.update(failed)
                too_big.update((v, pass_) for v in failed)
                for v in VARIANTS:
                    row = {
                        "dtype": dtype_name, "T": T, "pass": pass_, "variant": v, "time_s": None, "reps": 0,
                        "peak_bytes": None, "score_bytes": score_bytes, "skipped": skipped[v],
                    }  # fmt: skip
                    if v in medians:
                        row["time_s"], row["reps"] = medians[v], reps[v]
                        last_time[(v, pass_)] = (T, medians[v])
                        row["peak_bytes"] = peak_bytes(calls[v], device) if measure_memory else None
                    rows.append(row)
                del calls
            del x, grad_out
            if device.type == "cuda":
                torch.cuda.empty_cache()
    settings = dict(device=device.type, batch_size=batch_size, d_model=d_model, n_heads=n_heads,
                    d_k=d_model // n_heads, causal=causal, dtypes=list(dtypes), seq_lens=list(seq_lens),
                    budget_s=budget_s, threads=torch.get_num_threads(), seed=seed)  # fmt: skip
    return {"settings": settings, "rows": rows}


# ---------------------------------------------------------------------------------------------
# Reports: table, JSON, figure, summary
# ---------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``python -m benchmarks.attention``."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.attention",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument(
        "--seq-lens", type=int, nargs="+", default=None, help="default: 64 ... 4096 on the CPU, 64 ... 16384 on a GPU"
    )
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--d-model", type=int, default=None, help="default: 128 on the CPU, 384 on a GPU (the presets)")
    parser.add_argument("--heads", type=int, default=None, help="default: 4 on the CPU, 6 on a GPU")
    parser.add_argument(
        "--dtypes",
        nargs="+",
        default=None,
        choices=sorted(DTYPES),
        help="default: float32 (CPU); float32, bfloat16 (GPU)",
    )
    parser.add_argument("--threads", type=int, default=default_threads(), help="torch.set_num_threads (CPU)")
    parser.add_argument("--budget", type=float, default=2.0, help="seconds of timed calls per variant and point")
    parser.add_argument("--max-reps", type=int, default=20)
    parser.add_argument("--max-call-s", type=float, default=30.0, help="skip a point whose call would take longer")
    parser.add_argument("--skip-handwritten-backward-above", type=int, default=None, metavar="T")
    parser.add_argument("--no-memory", action="store_true", help="do not measure peak memory")
    parser.add_argument("--json", default=str(JSON_FILE), help="where the raw numbers go")
    parser.add_argument("--figure", default=None, help="default: attention_scaling.png, or _cuda.png for a GPU")
    add_record_flags(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)

    on_gpu = args.device == "cuda"
    if on_gpu and not torch.cuda.is_available():
        print("--device cuda needs a CUDA GPU; none is available.")
        return 0
    set_threads(args.threads)
    seq_lens = args.seq_lens or [2**i for i in range(6, 15 if on_gpu else 13)]
    dtypes = tuple(args.dtypes or (("float32", "bfloat16") if on_gpu else ("float32",)))
    if on_gpu:
        torch.backends.cuda.matmul.allow_tf32 = False  # float32 means float32 here
    result = sweep(
        seq_lens,
        batch_size=args.batch_size,
        d_model=args.d_model or (384 if on_gpu else 128),
        n_heads=args.heads or (6 if on_gpu else 4),
        device=args.device,
        dtypes=dtypes,
        budget_s=args.budget,
        max_reps=args.max_reps,
        max_call_s=args.max_call_s,
        skip_handwritten_backward_above=args.skip_handwritten_backward_above,
        measure_memory=not args.no_memory,
    )
    print(report(result))
    short = summary(result)
    print("\n".join(f"{k}: {v}" for k, v in short.items()))
    if not args.no_record:
        print(f"\nraw numbers: {save_json(result, args.json)}")
        figure = args.figure or HERE / ("attention_scaling_cuda.png" if on_gpu else "attention_scaling.png")
        print(f"figure: {plot(result, figure, dtypes[0])}")
        settings = {k: v for k, v in result["settings"].items() if k != "seq_lens"}
        settings["T"] = f"{seq_lens[0]}..{seq_lens[-1]}"
        settings["dtypes"] = "+".join(dtypes)
        print(f"appended to {append_result('attention', settings, short, args.results)}")
    synchronize(args.device)
    return 0


if __name__ == "__main__":
    sys.exit(main())
