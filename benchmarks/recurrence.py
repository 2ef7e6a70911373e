"""Softmax attention against the recurrences of chapter "Attention as a recurrence", on the CPU or a CUDA GPU: the time
of one causal forward against the length, the time of one decoding step against the context, and
the memory each holds.

For each length ``T`` it times one call on ``q, k, v (1, h, T, d)`` (unit queries and keys):

- ``softmax``: PyTorch's fused causal attention, ``F.scaled_dot_product_attention(is_causal=True)``,
  in the dtype of ``--softmax-dtype`` (bfloat16 by default on a GPU, where the flash kernel runs);
- ``linear``, ``delta`` and ``gated``: the book's chunked forms, ``tl.linear_attention`` and
  ``tl.delta_rule`` (without and with a decay gate), in float32. They are written in plain
  PyTorch, a loop over chunks of ``--chunk-size``: no fused kernel.

Then, for each context ``n``, one decoding step: a query against ``n`` cached keys and values
(softmax), against one recurrent step from a ``(d, d)`` state per head (the gated delta rule).
The memory columns are computed, not measured: the cache's bytes at ``n`` tokens, the state's at
any. The crossover is the first length from which a recurrence stays faster than softmax.

    python -m benchmarks.recurrence --no-record              # CPU: up to 8,192 tokens
    python -m benchmarks.recurrence --json out.json          # also writes the numbers as JSON
    python -m benchmarks.recurrence --seq-lens 256 512 --contexts 256 --repeats 1 --no-record
"""

from __future__ import annotations

import argparse
import json
import math
import sys

import torch
import torch.nn.functional as F

import transformer_lib as tl

from .common import add_record_flags, append_result, format_table, machine_info, set_threads, time_call

KINDS = ("softmax", "linear", "delta", "gated")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _inputs(T: int, heads: int, d: int, device, dtype, seed: int = 0):
    g = torch.Generator(device=device).manual_seed(seed)
    q, k, v = torch.randn(3, 1, heads, T, d, generator=g, device=device, dtype=dtype)
    beta = torch.rand(1, heads, T, generator=g, device=device, dtype=dtype)
    gate = -torch.rand(1, heads, T, generator=g, device=device, dtype=dtype)
    return tl.l2_normalize(q), tl.l2_normalize(k), v, beta, gate


def _best(fn, device, repeats: int) -> float:
    """The best of ``repeats`` timed calls after one warm-up, in milliseconds."""
    fn()
    return 1e3 * min(time_call(fn, device) for _ in range(repeats))


def forward_times(
    seq_lens, *, heads: int, d: int, chunk_size: int, device, softmax_dtype, repeats: int
) -> dict[str, list[float]]:
    """``{kind: [ms per length]}`` for one causal forward of each kind."""
    times = {kind: [] for kind in KINDS}
    for T in seq_lens:
        q, k, v, beta, gate = _inputs(T, heads, d, device, torch.float32)
        qs, ks, vs = (t.to(softmax_dtype) for t in (q, k, v))
        calls = {
            "softmax": lambda: F.scaled_dot_product_attention(qs, ks, vs, is_causal=True),
            "linear": lambda: tl.linear_attention(q, k, v, form="chunked", chunk_size=chunk_size),
            "delta": lambda: tl.delta_rule(q, k, v, beta, form="chunked", chunk_size=chunk_size),
            "gated": lambda: tl.delta_rule(q, k, v, beta, gate=gate, form="chunked", chunk_size=chunk_size),
        }
        with torch.no_grad():
            for kind, call in calls.items():
                times[kind].append(_best(call, device, repeats))
        print(f"T={T}: " + ", ".join(f"{kind} {times[kind][-1]:.2f} ms" for kind in KINDS), flush=True)
    return times


def decode_times(contexts, *, heads: int, d: int, device, softmax_dtype, repeats: int) -> dict[str, list[float]]:
    """``{"cache": [ms], "state": [ms]}``: one decoding step against ``n`` cached tokens, and one
    gated delta-rule step from a state (which does not depend on ``n``)."""
    times = {"cache": [], "state": []}
    for n in contexts:
        q, k, v, beta, gate = _inputs(n + 1, heads, d, device, torch.float32)
        q1, k_all, v_all = (t.to(softmax_dtype) for t in (q[:, :, -1:], k, v))
        state = torch.zeros(1, heads, d, d, device=device)
        step = (q[:, :, -1:], k[:, :, -1:], v[:, :, -1:], beta[:, :, -1:])
        with torch.no_grad():
            times["cache"].append(
                _best(lambda: F.scaled_dot_product_attention(q1, k_all, v_all), device, repeats)  # noqa: B023
            )
            times["state"].append(
                _best(
                    lambda: tl.delta_rule(*step, gate=gate[:, :, -1:], form="recurrent", initial_state=state),  # noqa: B023
                    device,
                    repeats,
                )
            )
    return times


def crossover(seq_lens, slow: list[float], fast: list[float]) -> int | None:
    """The first length from which ``fast`` stays below ``slow`` (None: never within ``seq_lens``)."""
    for i, T in enumerate(seq_lens):
        if all(f < s for f, s in zip(fast[i:], slow[i:], strict=True)):
            return T
    return None


def run(
    seq_lens, contexts, *, heads: int = 16, d: int = 128, chunk_size: int = 64, device: str = "cpu",
    softmax_dtype: str = "float32", repeats: int = 3,
) -> dict:  # fmt: skip
    """Every measurement, as a JSON-ready dict."""
    dev = torch.device(device)
    dtype = DTYPES[softmax_dtype]
    forward = forward_times(seq_lens, heads=heads, d=d, chunk_size=chunk_size, device=dev, softmax_dtype=dtype,
                            repeats=repeats)  # fmt: skip
    decode = decode_times(contexts, heads=heads, d=d, device=dev, softmax_dtype=dtype, repeats=repeats)
    element = torch.empty(0, dtype=dtype).element_size()
    return {
        "settings": dict(
            heads=heads,
            d=d,
            chunk_size=chunk_size,
            device=str(dev),
            softmax_dtype=softmax_dtype,
            recurrence_dtype="float32",
            repeats=repeats,
            batch=1,
        ),  # fmt: skip
        "device_name": torch.cuda.get_device_name(dev) if dev.type == "cuda" else machine_info()["machine"],
        "torch": torch.__version__,
        "seq_lens": list(seq_lens),
        "forward_ms": forward,
        "crossover": {kind: crossover(seq_lens, forward["softmax"], forward[kind]) for kind in KINDS[1:]},
        "contexts": list(contexts),
        "decode_ms": decode,
        "cache_bytes": [2 * heads * d * element * n for n in contexts],
        "state_bytes": heads * d * d * 4,
    }


def report(result: dict) -> str:
    rows = [[T, *(f"{result['forward_ms'][k][i]:.2f}" for k in KINDS)] for i, T in enumerate(result["seq_lens"])]
    out = [format_table(["T", *(f"{k} ms" for k in KINDS)], rows)]
    out.append("crossover (first length from which each stays faster than softmax): "
               + ", ".join(f"{k} {v}" for k, v in result["crossover"].items()))  # fmt: skip
    rows = [
        [n, f"{a:.3f}", f"{b:.3f}", f"{c / 2**20:.2f}", f"{result['state_bytes'] / 2**20:.2f}"]
        for n, a, b, c in zip(result["contexts"], *result["decode_ms"].values(), result["cache_bytes"], strict=True)
    ]
    out.append(format_table(["context", "cache step ms", "state step ms", "cache MiB", "state MiB"], rows))
    return "\n\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.recurrence", description=__doc__.split("\n\n")[0])
    cuda = torch.cuda.is_available()
    parser.add_argument("--seq-lens", type=int, nargs="+", default=None,
                        help="forward lengths (default: 256 to 8,192 on a CPU, to 131,072 on a GPU)")  # fmt: skip
    parser.add_argument("--contexts", type=int, nargs="+", default=None, help="cached tokens of the decoding step")
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--d", type=int, default=128, help="the query, key and value width")
    parser.add_argument("--chunk-size", type=int, default=64)
    parser.add_argument("--device", default="cuda" if cuda else "cpu")
    parser.add_argument("--softmax-dtype", choices=sorted(DTYPES), default="bfloat16" if cuda else "float32")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (CPU)")
    parser.add_argument("--json", default=None, metavar="PATH", help="also write every number to this JSON file")
    add_record_flags(parser)
    args = parser.parse_args(argv)
    on_gpu = args.device.startswith("cuda")
    seq_lens = args.seq_lens or [2**i for i in range(8, 18 if on_gpu else 14)]
    contexts = args.contexts or [2**i for i in range(8, 18 if on_gpu else 15, 2)]
    threads = set_threads(args.threads)
    result = run(seq_lens, contexts, heads=args.heads, d=args.d, chunk_size=args.chunk_size, device=args.device,
                 softmax_dtype=args.softmax_dtype, repeats=args.repeats)  # fmt: skip
    print(report(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    if not args.no_record:
        settings = dict(result["settings"], threads=threads, T=f"{seq_lens[0]}..{seq_lens[-1]}")
        last = {k: f"{v[-1]:.3g}" for k, v in result["forward_ms"].items()}
        summary = {f"{k}_ms@T={seq_lens[-1]}": v for k, v in last.items()}
        summary.update({f"crossover_{k}": v for k, v in result["crossover"].items()})
        print(f"appended to {append_result('recurrence', settings, summary, args.results)}")
    return 0 if all(math.isfinite(t) for ts in result["forward_ms"].values() for t in ts) else 1


if __name__ == "__main__":
    sys.exit(main())
