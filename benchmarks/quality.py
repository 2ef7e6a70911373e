"""How good a model the training command line makes: final validation loss and wall time.

It runs ``python -m transformer_lib train`` exactly as a reader would: the ``cpu`` preset for
2,000 steps on a CPU (nanoGPT's baby GPT reaches a validation loss of about 1.88), or on a GPU the
``gpu`` preset for 5,000 steps (nanoGPT: about 1.47), on Tiny Shakespeare. The text comes from
``--data``, else from the ``TINY_SHAKESPEARE`` environment variable (else the trainer looks in its
cache or downloads it; if it has to fall back to another text, the row says so and the
reference does not apply). The final loss is read from the checkpoint the run writes.

    TINY_SHAKESPEARE=/path/to/input.txt python -m benchmarks.quality              # cpu preset
    python -m benchmarks.quality --preset gpu --data /path/to/input.txt --compile
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import torch

import transformer_lib as tl

from .common import add_record_flags, append_result, default_threads, format_table

# preset: (steps, nanoGPT's final validation loss on Tiny Shakespeare at those steps)
REFERENCE = {"cpu": (2000, 1.88), "gpu": (5000, 1.47)}


def is_tiny_shakespeare(path: str | Path) -> bool:
    """Whether the file at ``path`` is Tiny Shakespeare (by its SHA-256)."""
    return tl.sha256_of(path) == tl.TINY_SHAKESPEARE_SHA256


def train_command(
    preset: str,
    steps: int,
    out_dir: str | Path,
    data: str | Path | None = None,
    device: str | None = None,
    compile: bool = False,
    extra_args: Sequence[str] = (),
) -> list[str]:
    """The training command line this benchmark runs."""
    cmd = [sys.executable, "-m", "transformer_lib", "train", "--preset", preset, "--max-iters", str(steps)]
    cmd += ["--out-dir", str(out_dir), "--no-progress"]
    if data is not None:
        cmd += ["--data", str(data)]
    if device is not None:
        cmd += ["--device", device]
    if compile:
        cmd += ["--compile"]
    return cmd + list(extra_args)


def _final_from_checkpoint(path: Path) -> dict:
    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    history, meta = ckpt["history"], ckpt.get("meta", {})
    losses, steps = history["val_loss"], history["eval_step"]
    best = min(range(len(losses)), key=losses.__getitem__)
    return {
        "val_loss": losses[-1], "step": steps[-1], "best_val_loss": losses[best], "best_step": steps[best],
        "corpus": meta.get("corpus"),
    }  # fmt: skip


def _final_from_output(text: str) -> dict:
    found = re.findall(r"final val loss ([0-9.]+) after (\d+) steps", text)
    if not found:
        raise RuntimeError("the training run printed no final validation loss")
    loss, step = found[-1]
    evals = [(float(v), int(s)) for s, v in re.findall(r"step (\d+): train loss [0-9.]+, val loss ([0-9.]+)", text)]
    best_loss, best_step = min(evals) if evals else (float(loss), int(step))
    return {
        "val_loss": float(loss),
        "step": int(step),
        "best_val_loss": best_loss,
        "best_step": best_step,
        "corpus": None,
    }


def run_quality(
    preset: str = "cpu",
    steps: int | None = None,
    data: str | Path | None = None,
    device: str | None = None,
    threads: int | None = None,
    compile: bool = False,
    extra_args: Sequence[str] = (),
    echo: bool = True,
) -> dict:
    """Run the training command line; returns the final validation loss, the wall time and the command.

    ``steps`` defaults to the reference's (2,000 for ``cpu``, 5,000 for ``gpu``); ``threads`` sets
    ``OMP_NUM_THREADS`` for the run; ``extra_args`` are passed on (e.g. smaller sizes for a
    smoke test). With ``echo`` the run's output is printed as it comes.
    """
    ref_steps, ref_loss = REFERENCE[preset]
    steps = ref_steps if steps is None else steps
    env = dict(os.environ)
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    with tempfile.TemporaryDirectory(prefix="quality-") as out_dir:
        cmd = train_command(preset, steps, out_dir, data, device, compile, extra_args)
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if echo:
                print(line, end="", flush=True)
        proc.wait()
        wall_s = time.perf_counter() - start
        output = "".join(lines)
        if proc.returncode != 0:
            raise RuntimeError(f"the training run failed ({proc.returncode}):\n{output[-3000:]}")
        ckpt = Path(out_dir) / "ckpt.pt"
        try:
            final = _final_from_checkpoint(ckpt)
        except (OSError, KeyError, IndexError):
            final = _final_from_output(output)
    corpus = final["corpus"] or ("tiny_shakespeare" if "tiny_shakespeare" in output else "unknown")
    if data is not None:  # the trainer names a file given with --data after the file
        corpus = "tiny_shakespeare" if is_tiny_shakespeare(data) else Path(data).name
    return {
        "preset": preset,
        "steps": steps,
        "val_loss": final["val_loss"],
        "eval_step": final["step"],
        "best_val_loss": final["best_val_loss"],
        "best_step": final["best_step"],
        "wall_s": wall_s,
        "corpus": corpus,
        "reference_loss": ref_loss if steps == ref_steps and corpus == "tiny_shakespeare" else None,
        "command": cmd,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.quality",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--preset", choices=sorted(REFERENCE), default=None, help="default: gpu if CUDA is available, else cpu"
    )
    parser.add_argument("--steps", type=int, default=None, help="default: 2000 (cpu) or 5000 (gpu)")
    parser.add_argument("--data", default=None, metavar="PATH", help="Tiny Shakespeare (default: $TINY_SHAKESPEARE)")
    parser.add_argument("--device", default=None, help="passed on to the trainer (default: its own choice)")
    parser.add_argument("--threads", type=int, default=default_threads(), help="OMP_NUM_THREADS of the run (CPU)")
    parser.add_argument("--compile", action="store_true", help="train with torch.compile")
    add_record_flags(parser)
    args = parser.parse_args(argv)

    preset = args.preset or ("gpu" if torch.cuda.is_available() else "cpu")
    if args.data is None and not os.environ.get("TINY_SHAKESPEARE"):
        print("note: neither --data nor TINY_SHAKESPEARE is set; the trainer will look for Tiny Shakespeare itself")
    r = run_quality(preset, args.steps, args.data, args.device, args.threads, args.compile)
    reference = "-" if r["reference_loss"] is None else f"{r['reference_loss']:.2f}"
    best = f"{r['best_val_loss']:.4f} (step {r['best_step']})"
    rows = [[preset, r["steps"], r["corpus"], f"{r['val_loss']:.4f}", best, reference, f"{r['wall_s']:.0f}"]]
    print()
    print(format_table(["preset", "steps", "text", "final val loss", "best val loss", "nanoGPT", "wall s"], rows))
    print("(nanoGPT's number is its best validation loss: it keeps the checkpoint only when the loss improves)")
    if r["reference_loss"] is None:
        print("(no reference: the run did not use Tiny Shakespeare or not the preset's number of steps)")
    if not args.no_record:
        settings = dict(preset=preset, steps=r["steps"], text=r["corpus"], threads=args.threads, compile=args.compile)
        results = dict(
            val_loss=f"{r['val_loss']:.4f}", best_val_loss=best, nanogpt=reference, wall_s=f"{r['wall_s']:.0f}"
        )
        print(f"\nappended to {append_result('quality', settings, results, args.results)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
