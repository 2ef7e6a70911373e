"""GPU training throughput and model FLOPs utilisation (MFU) of ``tl.GPT``.

Two shapes: the training command line's ``gpu`` preset (6 layers, 6 heads, d_model 384, context
256, batch 64, Tiny Shakespeare's 65 characters) and GPT-2 small (12 layers, 12 heads, d_model
768, context 1024, vocabulary 50304). Each trains on random tokens with bfloat16 autocast, TF32
matmuls, fused AdamW and gradient clipping, once eagerly and once under ``torch.compile``;
after a warm-up (which includes the compilation) it times ``rounds`` blocks of ``steps`` steps
and reports the median tokens per second, the time per step, the peak memory and

    MFU = tokens/s * (6 N + 12 L h d_k T) / peak FLOP/s,

with ``N`` the parameters without the position embeddings and the peak the GPU's dense bf16
rate (989.4 TFLOP/s for an H100 or H200; ``--peak-tflops`` for a GPU the table lacks).
Without CUDA it says so and exits 0.

    python -m benchmarks.gpu_training
    python -m benchmarks.gpu_training --shapes gpt2-small --compile on --peak-tflops 312
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time

import torch
from torch import Tensor, nn

import transformer_lib as tl

from .common import add_record_flags, append_result, format_table, median, synchronize

_GPU_SHAPE, _GPU_TRAIN = tl.PRESETS["gpu"]
# The GPU preset of the training command line, and GPT-2 small.
SHAPES: dict[str, dict] = {
    "gpu-preset": dict(**_GPU_SHAPE, batch_size=_GPU_TRAIN.batch_size, vocab_size=65),
    "gpt2-small": dict(
        n_layers=12, n_heads=12, d_model=768, context_len=1024, batch_size=16, vocab_size=50304, dropout=0.0
    ),
}


def random_batches(n: int, vocab_size: int, B: int, T: int, seed: int, device: torch.device) -> list:
    """``n`` batches ``(x (B, T), y (B, T))`` of random tokens on ``device``, ``y`` shifted by one."""
    g = torch.Generator().manual_seed(seed)
    tokens = [torch.randint(vocab_size, (B, T + 1), generator=g).to(device) for _ in range(n)]  # (B, T + 1) each
    return [(t[:, :-1], t[:, 1:]) for t in tokens]


def _seconds(call, device: torch.device) -> float:
    """Wall time of ``call()``, the device's queued work included."""
    synchronize(device)
    start = time.perf_counter()
    call()
    synchronize(device)
    return time.perf_counter() - start


def measure(
    shape: dict,
    compile: bool,
    device: str = "cuda",
    dtype: torch.dtype = torch.bfloat16,
    warmup: int = 10,
    steps: int = 50,
    rounds: int = 3,
    seed: int = 0,
    peak: float | None = None,
) -> dict:
    """Train a GPT of ``shape`` on random tokens; returns tokens/s per round, their median, MFU and memory.

    ``shape`` has the keys of :data:`SHAPES`. ``dtype`` is the autocast precision (``torch.float32``:
    no autocast). ``peak`` is the hardware's FLOP/s; without it ``mfu`` is ``None``.
    """
    device = torch.device(device)
    on_gpu = device.type == "cuda"
    if on_gpu:  # TF32 for what autocast leaves in float32; the peak memory of the whole run
        torch.set_float32_matmul_precision("high")
        torch.cuda.reset_peak_memory_stats()
    torch.manual_seed(seed)
    sizes = {k: shape[k] for k in ("vocab_size", "context_len", "n_layers", "n_heads", "d_model", "dropout")}
    model = tl.GPT(tl.GPTConfig(**sizes)).to(device).train()
    optimizer = tl.configure_optimizer(model, tl.TrainConfig(lr=6e-4, beta2=0.95), device)  # fused on a GPU
    step_model = torch.compile(model) if compile else model
    B, T = shape["batch_size"], shape["context_len"]
    batches = itertools.cycle(random_batches(8, shape["vocab_size"], B, T, seed, device))

    def train_steps(n: int) -> Tensor:
        for _ in range(n):
            x, y = next(batches)
            with tl.autocast(device, dtype):
                _, loss = step_model(x, y)
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    warmup_s = _seconds(lambda: train_steps(warmup), device)
    rates = [B * T * steps / _seconds(lambda: train_steps(steps), device) for _ in range(rounds)]
    loss = train_steps(1)
    rate = median(rates)
    per_token = tl.flops_per_token(model, T)
    return {
        "tokens_per_s": rates,
        "median_tokens_per_s": rate,
        "ms_per_step": 1000 * B * T / rate,
        "flops_per_token": per_token,
        "mfu": per_token * rate / peak if peak else None,
        "params": model.num_params(),
        "peak_memory_bytes": torch.cuda.max_memory_allocated() if on_gpu else None,
        "warmup_s": warmup_s,
        "loss": loss.item(),
    }


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``python -m benchmarks.gpu_training``."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.gpu_training",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--shapes", nargs="+", choices=sorted(SHAPES), default=list(SHAPES))
    parser.add_argument("--compile", choices=["off", "on", "both"], default="both", help="torch.compile the model")
    parser.add_argument("--warmup", type=int, default=10, help="untimed steps first (the compilation happens here)")
    parser.add_argument("--steps", type=int, default=50, help="timed steps per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--gpt2-batch-size", type=int, default=SHAPES["gpt2-small"]["batch_size"])
    parser.add_argument(
        "--peak-tflops", type=float, default=None, help="the GPU's dense bf16 peak (default: looked up)"
    )
    add_record_flags(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)

    if not torch.cuda.is_available():
        print("gpu_training needs a CUDA GPU and this machine has none; nothing to measure.")
        return 0
    name = torch.cuda.get_device_name()
    peak = args.peak_tflops * 1e12 if args.peak_tflops else tl.gpu_peak_flops(name)
    if peak is None:
        print(f"the peak FLOP/s of {name!r} is not known: MFU is left out (give it with --peak-tflops)")
    dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    compile_modes = {"off": [False], "on": [True], "both": [False, True]}[args.compile]
    table, records = [], {}
    for shape_name in args.shapes:
        shape = dict(SHAPES[shape_name])
        if shape_name == "gpt2-small":
            shape["batch_size"] = args.gpt2_batch_size
        for compiled in compile_modes:
            r = measure(shape, compiled, "cuda", dtype, args.warmup, args.steps, args.rounds, peak=peak)
            mfu = "-" if r["mfu"] is None else f"{100 * r['mfu']:.1f}%"
            table.append(
                [
                    shape_name,
                    "on" if compiled else "off",
                    f"{r['params'] / 1e6:.1f}M",
                    f"{r['median_tokens_per_s']:,.0f}",
                    f"{r['ms_per_step']:.1f}",
                    mfu,
                    f"{r['peak_memory_bytes'] / 2**30:.1f}",
                    f"{r['warmup_s']:.0f}",
                ]
            )
            key = f"{shape_name}{'+compile' if compiled else ''}"
            records[f"{key}_tok_s"] = f"{r['median_tokens_per_s']:.0f}"
            records[f"{key}_mfu"] = mfu
            torch.cuda.empty_cache()
    headers = ["shape", "compile", "params", "tokens/s", "ms/step", "MFU", "peak GiB", "warm-up s"]
    print(f"{name}, {dtype}, peak {peak / 1e12 if peak else '?'} TFLOP/s\n")
    print(format_table(headers, table))
    if not args.no_record:
        settings = dict(
            shapes="+".join(args.shapes),
            gpt2_batch=args.gpt2_batch_size,
            dtype=str(dtype).removeprefix("torch."),
            warmup=args.warmup,
            steps=args.steps,
            rounds=args.rounds,
            peak_tflops=peak / 1e12 if peak else None,
        )
        print(f"\nappended to {append_result('gpu_training', settings, records, args.results)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
