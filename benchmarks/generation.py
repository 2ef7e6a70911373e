"""Generation speed of ``tl.GPT`` with and without the key-value cache, against context length.

At the ``gpu`` preset's model shape (6 layers, 6 heads, d_model 384, context 256; the weights
are random: speed does not depend on them) a one-token prompt is extended greedily
(``top_k=1``) until the sequence is ``T`` tokens long, for each ``T`` in ``--contexts``.
Uncached, every step re-runs the whole prefix, so a step costs time growing with ``T`` and the
whole generation about ``T^2``; cached, the prompt is run once and every step runs one token
against the stored keys and values. Both must produce the same tokens (checked every round).
The two take turns, in an order that alternates every round; the table shows the median tokens
per second over the rounds with the spread (lowest to highest), the median of the per-round
speed-ups (wall clock), and the same ratio of the CPU time the process used (less sensitive to
other work on a shared machine, which stretches the wall clock of many small steps the most).
The cached path's time is also split into the prefill and the mean per-token step, and a last
column gives the cost of one more token once the context already holds ``T - 1`` tokens (one
forward pass over ``T`` tokens uncached, one cached step): the speed-up of a long generation
tends to their ratio, while generating from one token up to ``T`` averages over shorter contexts.

Target: cached / uncached >= 10 at context 256 on a 2-core CPU.

``--peer hf`` measures something else: cached greedy generation against Hugging Face
``transformers``' ``GPT2LMHeadModel.generate(use_cache=True)`` with the same shape and the same
weights, a ``--prompt-len``-token prompt (64) and ``--new-tokens`` (128) new tokens, at each of
``--batch-sizes`` (1 and 8), the two taking turns in an order that alternates every round. Beside
our cached step time it prints the least a step can take on this machine: a step reads every
weight once (and the cached keys and values), so it cannot beat those bytes divided by the
memory bandwidth, which is measured on the spot (the best of a few reads of a buffer much larger
than the caches). Targets: ours / transformers >= 1.20 at both batch sizes; the cached step at
batch 1 within 2x of that limit.

    python -m benchmarks.generation                     # the real run; appends a row to RESULTS.md
    python -m benchmarks.generation --threads 1 --rounds 5 --contexts 32,64
    python -m benchmarks.generation --peer hf --rounds 5
    python -m benchmarks.generation --peer hf --profile   # and where each one's token spends its time
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

import transformer_lib as tl

from .common import add_record_flags, append_result, format_op_profile, format_table, median, op_profile, set_threads

VOCAB_SIZE = 65  # Tiny Shakespeare's characters
GPU_SHAPE = dict(n_layers=6, n_heads=6, d_model=384, context_len=256)  # tl.PRESETS["gpu"]'s model shape


def build_model(shape: dict, seed: int, dtype: torch.dtype = torch.float32) -> tl.GPT:
    """A GPT of ``shape`` in eval mode (so dropout, whatever its setting, changes nothing)."""
    torch.manual_seed(seed)
    return tl.GPT(tl.GPTConfig(vocab_size=VOCAB_SIZE, **shape)).to(dtype).eval()


def time_generation(
    model: tl.GPT, prompt: torch.Tensor, n_new: int, use_cache: bool
) -> tuple[float, float, torch.Tensor]:
    """Wall-clock seconds and CPU seconds (all threads of this process) to generate ``n_new``
    tokens greedily after ``prompt``, and the tokens. On a machine shared with other work the
    wall clock includes the time spent waiting for a core; the CPU time does not."""
    start, cpu = time.perf_counter(), time.process_time()
    out = model.generate(prompt, n_new, top_k=1, use_cache=use_cache)
    return time.perf_counter() - start, time.process_time() - cpu, out


@torch.no_grad()
def split_cached(model: tl.GPT, prompt: torch.Tensor, n_new: int) -> tuple[float, float]:
    """The cached path's time in two parts: the prefill, and the mean time of one later step."""
    cache = model.new_cache()
    start = time.perf_counter()
    logits, _ = model(prompt, cache=cache)
    prefill = time.perf_counter() - start
    nxt = logits[:, -1].argmax(-1, keepdim=True)
    start = time.perf_counter()
    for _ in range(n_new - 1):
        logits, _ = model(nxt, cache=cache)
        nxt = logits[:, -1].argmax(-1, keepdim=True)
    return prefill, (time.perf_counter() - start) / max(1, n_new - 1)


@torch.no_grad()
def per_token_at_context(model: tl.GPT, prompt_row: torch.Tensor, T: int, repeats: int = 5) -> tuple[float, float]:
    """Milliseconds to produce one more token once the context holds ``T - 1`` tokens: uncached,
    one forward pass over the ``T`` tokens; cached, one step of one token against ``T - 1`` cached
    positions (the cache is cut back after each step). Medians over ``repeats``."""
    idx = prompt_row.repeat(1, T)[:, :T]  # (B, T)
    uncached = []
    for _ in range(repeats):
        start = time.perf_counter()
        model(idx)
        uncached.append(time.perf_counter() - start)
    cache = model.new_cache()
    model(idx[:, :-1], cache=cache)
    cached = []
    for _ in range(repeats):
        start = time.perf_counter()
        model(idx[:, -1:], cache=cache)
        cached.append(time.perf_counter() - start)
        for layer in cache.layers:  # back to T - 1 cached positions (cache.position reads them)
            c = layer.self_attn
            c.k, c.v, c.position = c.k[:, :, : T - 1], c.v[:, :, : T - 1], T - 1
    return 1000 * median(uncached), 1000 * median(cached)


def run_generation(
    contexts: tuple[int, ...] = (32, 64, 128, 256),
    *,
    shape: dict | None = None,
    batch_size: int = 1,
    prompt_len: int = 1,
    rounds: int = 3,
    threads: int | None = 2,
    seed: int = 1337,
) -> dict:
    """Time cached and uncached generation up to each context length; returns every round."""
    shape = dict(GPU_SHAPE if shape is None else shape)
    threads = set_threads(threads)
    if max(contexts) > shape["context_len"]:
        raise ValueError(f"contexts up to {max(contexts)} need context_len >= that, got {shape['context_len']}")
    if min(contexts) <= prompt_len:
        raise ValueError(f"every context must be longer than the prompt ({prompt_len} tokens), got {contexts}")
    model = build_model(shape, seed)
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, VOCAB_SIZE, (batch_size, prompt_len), generator=g)
    time_generation(model, prompt, 4, True)  # warm-up: first calls allocate and pick kernels
    time_generation(model, prompt, 4, False)
    rows = []
    for T in contexts:
        n_new = T - prompt_len
        seconds = {"cached": [], "uncached": []}
        cpu = {"cached": [], "uncached": []}
        same = True
        for r in range(rounds):
            order = ("cached", "uncached") if r % 2 == 0 else ("uncached", "cached")
            outs = {}
            for name in order:
                wall, used, outs[name] = time_generation(model, prompt, n_new, name == "cached")
                seconds[name].append(wall)
                cpu[name].append(used)
            same &= torch.equal(outs["cached"], outs["uncached"])
        prefill, step = split_cached(model, prompt, n_new)
        at_T = per_token_at_context(model, prompt, T)
        tok_s = {name: [batch_size * n_new / s for s in v] for name, v in seconds.items()}
        speedups = [u / c for c, u in zip(seconds["cached"], seconds["uncached"], strict=True)]
        cpu_speedups = [u / c for c, u in zip(cpu["cached"], cpu["uncached"], strict=True)]
        rows.append({"T": T, "new_tokens": n_new, "tok_s": tok_s, "speedup": speedups, "cpu_speedup": cpu_speedups,
                     "same_tokens": same, "prefill_ms": 1000 * prefill, "step_ms": 1000 * step,
                     "at_T_ms": {"uncached": at_T[0], "cached": at_T[1]}})  # fmt: skip
    settings = {**shape, "vocab_size": VOCAB_SIZE, "batch_size": batch_size, "prompt_len": prompt_len,
                "rounds": rounds, "threads": threads, "seed": seed, "greedy": "top_k=1"}  # fmt: skip
    return {"settings": settings, "rows": rows}


def _spread(values: list[float], fmt: str) -> str:
    return f"{format(median(values), fmt)} ({format(min(values), fmt)}..{format(max(values), fmt)})"


def report(result: dict) -> str:
    """The printed table: per context length, tokens/s (median, spread) both ways and the speed-up."""
    rows = []
    for row in result["rows"]:
        rows.append([
            row["T"],
            _spread(row["tok_s"]["uncached"], ".1f"),
            _spread(row["tok_s"]["cached"], ".1f"),
            _spread(row["speedup"], ".1f"),
            _spread(row["cpu_speedup"], ".1f"),
            f"{row['prefill_ms']:.1f}",
            f"{row['step_ms']:.2f}",
            f"{row['at_T_ms']['uncached']:.1f} / {row['at_T_ms']['cached']:.1f}",
            "yes" if row["same_tokens"] else "NO",
        ])  # fmt: skip
    headers = ["T", "uncached tok/s", "cached tok/s", "speed-up", "CPU-time ratio", "prefill ms", "step ms",
               "ms/token at T (uncached / cached)", "same tokens"]  # fmt: skip
    n = result["settings"]["rounds"]
    return format_table(headers, rows) + f"\nmedians over {n} rounds (lowest..highest); target: speed-up >= 10 at T=256"


def memory_bandwidth(n_bytes: int = 512 * 2**20, repeats: int = 5) -> float:
    """Bytes per second this process reads from memory: the best of ``repeats`` sums of a float32
    buffer of ``n_bytes`` (far larger than the CPU's caches), with the thread count in use."""
    x = torch.ones(n_bytes // 4)
    x.sum()  # touch every page first
    best = min(_timed(x.sum) for _ in range(repeats))
    return n_bytes / best


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def step_bytes(model: tl.GPT, batch_size: int, context: int) -> int:
    """The bytes one cached step must read at least: every parameter once (the tied head counted
    once) and the keys and values of ``context`` cached positions in every layer."""
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    c = model.config
    n_kv = c.n_heads if c.n_kv_heads is None else c.n_kv_heads
    kv = 2 * c.n_layers * batch_size * context * n_kv * (c.d_model // c.n_heads) * 4
    return weights + kv


def run_peer_generation(
    batch_sizes: tuple[int, ...] = (1, 8),
    *,
    shape: dict | None = None,
    prompt_len: int = 64,
    new_tokens: int = 128,
    rounds: int = 5,
    threads: int | None = 2,
    seed: int = 1337,
    profile: bool = False,
) -> dict:
    """Cached greedy generation, ours against ``transformers``' ``generate`` (same weights), per
    batch size: tokens/s of every round, our mean cached step, and the memory-bandwidth limit.
    ``profile``: then one generation of each under PyTorch's profiler, per generated token, in
    each row's ``"profile"`` (:func:`benchmarks.common.op_profile`)."""
    from .cpu_throughput import HFPeerGPT, copy_weights

    shape = dict(GPU_SHAPE if shape is None else shape)
    if prompt_len + new_tokens > shape["context_len"]:
        raise ValueError(f"prompt_len + new_tokens = {prompt_len + new_tokens} > context_len {shape['context_len']}")
    threads = set_threads(threads)
    ours = build_model(shape, seed)
    peer = HFPeerGPT(tl.GPTConfig(vocab_size=VOCAB_SIZE, **shape)).eval()
    with torch.no_grad():
        copy_weights(ours, peer)
    gpt2 = peer.gpt2

    def run_hf(prompt: torch.Tensor) -> torch.Tensor:
        return gpt2.generate(
            input_ids=prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new_tokens,
            min_new_tokens=new_tokens, do_sample=False, use_cache=True, pad_token_id=0,
        )  # fmt: skip

    def run_ours(prompt: torch.Tensor) -> torch.Tensor:
        return ours.generate(prompt, new_tokens, top_k=1)

    bandwidth = memory_bandwidth()
    g = torch.Generator().manual_seed(seed)
    rows = []
    for B in batch_sizes:
        prompt = torch.randint(0, VOCAB_SIZE, (B, prompt_len), generator=g)
        runs = {"ours": run_ours, "hf": run_hf}
        outs = {name: fn(prompt) for name, fn in runs.items()}  # warm-up, and the tokens to compare
        agree = (outs["ours"][:, prompt_len:] == outs["hf"][:, prompt_len:]).float().mean().item()
        seconds: dict[str, list[float]] = {"ours": [], "hf": []}
        for r in range(rounds):
            for name in ("ours", "hf") if r % 2 == 0 else ("hf", "ours"):
                seconds[name].append(_timed(lambda fn=runs[name]: fn(prompt)))
        _, step = split_cached(ours, prompt, new_tokens)
        limit = step_bytes(ours, B, prompt_len + new_tokens // 2) / bandwidth
        tok_s = {name: [B * new_tokens / s for s in v] for name, v in seconds.items()}
        ratios = [h / o for o, h in zip(seconds["ours"], seconds["hf"], strict=True)]
        profiles = (
            op_profile({n: (lambda fn=fn: fn(prompt)) for n, fn in runs.items()}, 1, new_tokens) if profile else None
        )
        rows.append({"B": B, "tok_s": tok_s, "ratio": ratios, "step_ms": 1000 * step, "limit_ms": 1000 * limit,
                     "same_tokens": agree, "profile": profiles})  # fmt: skip
    settings = {**shape, "vocab_size": VOCAB_SIZE, "prompt_len": prompt_len, "new_tokens": new_tokens,
                "rounds": rounds, "threads": threads, "seed": seed, "greedy": "top_k=1 / do_sample=False",
                "peer": "transformers GPT2LMHeadModel.generate(use_cache=True)"}  # fmt: skip
    return {"settings": settings, "bandwidth_gb_s": bandwidth / 1e9, "rows": rows}


def report_peer(result: dict) -> str:
    """The printed table of :func:`run_peer_generation`."""
    rows = []
    for row in result["rows"]:
        rows.append([
            row["B"],
            _spread(row["tok_s"]["ours"], ",.0f"),
            _spread(row["tok_s"]["hf"], ",.0f"),
            _spread(row["ratio"], ".2f"),
            f"{row['step_ms']:.2f}",
            f"{row['limit_ms']:.2f}",
            f"{row['step_ms'] / row['limit_ms']:.1f}x",
            f"{100 * row['same_tokens']:.0f}%",
        ])  # fmt: skip
    headers = ["batch", "ours tok/s", "transformers tok/s", "ours / transformers", "our step ms",
               "limit ms", "step / limit", "same tokens"]  # fmt: skip
    s = result["settings"]
    profiles = "".join(
        f"\n\nbatch {row['B']}, where a generated token's time goes (self CPU time per token, under the profiler):\n"
        + format_op_profile(row["profile"], {"ours": "tl.GPT", "hf": "transformers"})
        for row in result["rows"]
        if row.get("profile")
    )
    return (
        format_table(headers, rows)
        + f"\nmedians over {s['rounds']} rounds (lowest..highest); prompt {s['prompt_len']}, "
        f"{s['new_tokens']} new tokens; memory bandwidth {result['bandwidth_gb_s']:.1f} GB/s; the limit reads "
        "every weight and the cache at the mean context once\ntargets: ours / transformers >= 1.20 at every "
        "batch size; step / limit <= 2 at batch 1" + profiles
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.generation",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--contexts", default="32,64,128,256", help="comma-separated sequence lengths to reach")
    parser.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    parser.add_argument("--rounds", type=int, default=3, help="rounds; each path once per round")
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--seed", type=int, default=1337)
    parser.add_argument("--peer", choices=["hf"], default=None, help="cached generation against transformers")
    parser.add_argument("--batch-sizes", default="1,8", help="with --peer: comma-separated batch sizes")
    parser.add_argument("--prompt-len", type=int, default=64, help="with --peer: prompt tokens")
    parser.add_argument("--new-tokens", type=int, default=128, help="with --peer: tokens to generate")
    parser.add_argument("--profile", action="store_true", help="with --peer: then profile one generation of each")
    add_record_flags(parser)
    args = parser.parse_args(argv)
    if args.peer:
        return _main_peer(parser, args)
    try:
        contexts = tuple(int(c) for c in args.contexts.split(",") if c)
    except ValueError:
        parser.error(f"--contexts must be comma-separated ints, got {args.contexts!r}")
    result = run_generation(
        contexts, batch_size=args.batch_size, rounds=args.rounds, threads=args.threads, seed=args.seed
    )
    print(report(result))
    if not args.no_record:
        results = {}
        for row in result["rows"]:
            T = row["T"]
            results[f"uncached_tok_s@{T}"] = f"{median(row['tok_s']['uncached']):.1f}"
            results[f"cached_tok_s@{T}"] = f"{median(row['tok_s']['cached']):.1f}"
            results[f"speedup@{T}"] = _spread(row["speedup"], ".1f")
            results[f"cpu_time_ratio@{T}"] = _spread(row["cpu_speedup"], ".1f")
            at_T = row["at_T_ms"]
            results[f"ms_per_token_at_context@{T}"] = f"{at_T['uncached']:.1f}/{at_T['cached']:.1f}"
        results["same_tokens"] = all(row["same_tokens"] for row in result["rows"])
        results["target"] = "speedup@256>=10"
        print(f"\nappended to {append_result('generation', result['settings'], results, args.results)}")
    return 0


def _main_peer(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from .cpu_throughput import hf_available

    if not hf_available():
        parser.error("--peer hf needs Hugging Face transformers (pip install transformers)")
    try:
        batch_sizes = tuple(int(b) for b in args.batch_sizes.split(",") if b)
    except ValueError:
        parser.error(f"--batch-sizes must be comma-separated ints, got {args.batch_sizes!r}")
    result = run_peer_generation(
        batch_sizes, prompt_len=args.prompt_len, new_tokens=args.new_tokens, rounds=args.rounds,
        threads=args.threads, seed=args.seed, profile=args.profile,
    )  # fmt: skip
    print(report_peer(result))
    if not args.no_record:
        results = {"bandwidth_gb_s": f"{result['bandwidth_gb_s']:.1f}"}
        for row in result["rows"]:
            B = row["B"]
            results[f"ours_tok_s@B{B}"] = f"{median(row['tok_s']['ours']):.0f}"
            results[f"hf_tok_s@B{B}"] = f"{median(row['tok_s']['hf']):.0f}"
            results[f"ratio@B{B}"] = _spread(row["ratio"], ".2f")
            results[f"step_ms@B{B}"] = f"{row['step_ms']:.2f} (limit {row['limit_ms']:.2f})"
        results["target"] = "ratio>=1.20, step<=2x limit at B1"
        print(f"\nappended to {append_result('generation_peer', result['settings'], results, args.results)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
