"""Peak memory of attention against the sequence length on the CPU: the naive path, PyTorch's
fused kernel and the library's tiled attention (chapter "Long context and precision").

For each ``T`` it runs one attention call of ``q, k, v (1, 1, T, d)`` (one head, float32,
not causal) with :func:`tl.attention_peak_memory`, forward only and forward plus backward,
and reports the peak extra bytes (the allocations and frees that ``torch.profiler`` records,
replayed in order) and, for each doubling of ``T``, how much the peak grew. The naive path
holds the ``(T, T)`` scores and weights, so it should grow about 4x per doubling; the tiled
path holds the ``(T, d)`` output (and gradients) plus a few ``(block, block)`` tiles, so it
should grow about 2x. Memory does not depend on the machine's load; the wall time of the tiled
path (a Python loop, slowed further by the profiler) does, and is not reported.

    python -m benchmarks.tiled_memory                  # T = 512 ... 8192, a few minutes
    python -m benchmarks.tiled_memory --seq-lens 256 512 --no-record
"""

from __future__ import annotations

import argparse
import sys

import transformer_lib as tl

from .common import add_record_flags, append_result, format_table, set_threads

METHODS = ("naive", "fused", "tiled")
PASSES = {"fwd": False, "fwdbwd": True}


def sweep(seq_lens: list[int], *, d: int = 64, block_size: int = 128) -> dict:
    """``{"settings": ..., "peak": {(pass, method, T): bytes}}`` for every pass, method and length."""
    peak = {}
    for T in seq_lens:
        for name, backward in PASSES.items():
            for method in METHODS:
                peak[name, method, T] = tl.attention_peak_memory(
                    T, method=method, d=d, backward=backward, block_size=block_size
                )
    settings = dict(d=d, n_heads=1, batch=1, block_size=block_size, dtype="float32", causal=False)
    return {"settings": settings, "seq_lens": list(seq_lens), "peak": peak}


def growth(result: dict, name: str, method: str, T: int) -> float | None:
    """Peak at ``T`` over the peak at the previous length (None for the first)."""
    lens = result["seq_lens"]
    i = lens.index(T)
    if i == 0:
        return None
    return result["peak"][name, method, T] / result["peak"][name, method, lens[i - 1]]


def report(result: dict) -> str:
    """One table per pass: MiB per method, and the growth from the previous length."""
    out = []
    for name in PASSES:
        rows = []
        for T in result["seq_lens"]:
            row = [T]
            for method in METHODS:
                row.append(f"{result['peak'][name, method, T] / 2**20:.3f}")
            for method in METHODS:
                g = growth(result, name, method, T)
                row.append("" if g is None else f"{g:.2f}x")
            rows.append(row)
        headers = ["T", *[f"{m} MiB" for m in METHODS], *[f"{m} growth" for m in METHODS]]
        out.append(f"{name}:\n{format_table(headers, rows)}")
    return "\n\n".join(out)


def summary(result: dict) -> dict[str, str]:
    """The numbers that go to RESULTS.md: MiB per length and method, and the growth at the last doubling."""
    short = {}
    last = result["seq_lens"][-1]
    for name in PASSES:
        for method in METHODS:
            mib = "/".join(f"{result['peak'][name, method, T] / 2**20:.3g}" for T in result["seq_lens"])
            short[f"{method}_MiB_{name}"] = mib
            g = growth(result, name, method, last)
            if g is not None:
                short[f"{method}_growth_{name}@T={last}"] = f"{g:.2f}x"
    return short


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.tiled_memory", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seq-lens", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192])
    parser.add_argument("--d", type=int, default=64, help="the query/key/value width")
    parser.add_argument("--block-size", type=int, default=128, help="the tile size of tiled attention")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    add_record_flags(parser)
    args = parser.parse_args(argv)
    threads = set_threads(args.threads)  # the fused kernel's buffers depend on the thread count
    result = sweep(args.seq_lens, d=args.d, block_size=args.block_size)
    print(report(result))
    if not args.no_record:
        settings = dict(result["settings"], T="/".join(str(T) for T in args.seq_lens), threads=threads)
        print(f"appended to {append_result('tiled_memory', settings, summary(result), args.results)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
