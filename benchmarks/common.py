"""What every benchmark shares: a description of the machine, timing, a printed table, and the
dated row each real run appends to ``benchmarks/RESULTS.md``."""

from __future__ import annotations

import datetime
import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
RESULTS_FILE = HERE / "RESULTS.md"

# Used only when the results file is missing; the file in the repository explains each benchmark.
RESULTS_HEADER = """\
# Benchmark results

What each benchmark measures and its target: `benchmarks/README.md`.

| date | benchmark | machine | python | torch | settings | results |
| --- | --- | --- | --- | --- | --- | --- |
"""


# ---------------------------------------------------------------------------------------------
# The machine
# ---------------------------------------------------------------------------------------------


def cpu_model() -> str:
    """The CPU's model name (from ``/proc/cpuinfo`` on Linux), else what ``platform`` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def machine_info() -> dict[str, str]:
    """``machine`` (CPU model and cores, plus the GPU if there is one), ``python`` and ``torch``."""
    machine = f"{cpu_model()}, {os.cpu_count()} cores"
    if torch.cuda.is_available():
        machine += f"; {torch.cuda.get_device_name()}"
    return {"machine": machine, "python": platform.python_version(), "torch": torch.__version__}


def set_threads(n: int | None) -> int:
    """Fix PyTorch's intra-op thread count (``None``: leave it); returns the count in use."""
    if n is not None:
        if n < 1:
            raise ValueError(f"the thread count must be positive, got {n}")
        torch.set_num_threads(n)
    return torch.get_num_threads()


def default_threads() -> int:
    """The default thread count of the CPU benchmarks: every core, at most 8."""
    return max(1, min(8, os.cpu_count() or 1))


# ---------------------------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------------------------


def synchronize(device: torch.device | str) -> None:
    """Wait for the device's queued work (a no-op on the CPU)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def time_call(fn: Callable[[], object], device: torch.device | str = "cpu") -> float:
    """Seconds one call of ``fn`` takes, the device's queued work included."""
    synchronize(device)
    start = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - start


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def op_profile(
    fns: dict[str, Callable[[], object]], calls: int, per_call: int = 1
) -> dict[str, dict[str, tuple[float, float]]]:
    """Where the time goes: each ``fns[name]`` called ``calls`` times under PyTorch's profiler.
    Returns, per name, ``{operator: (self CPU milliseconds, operator calls)}``, both per unit of
    work, where one call does ``per_call`` units (a generation call makes that many tokens)."""
    from torch.profiler import ProfilerActivity, profile

    out = {}
    for name, fn in fns.items():
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(calls):
                fn()
        n = calls * per_call
        out[name] = {e.key: (e.self_cpu_time_total / 1000 / n, e.count / n) for e in prof.key_averages()}
    return out


def _short(name: str, width: int = 48) -> str:
    """``name`` cut in the middle to ``width`` characters, so that both ends still tell it apart."""
    if len(name) <= width:
        return name
    half = (width - 3) // 2
    return name[:half] + "..." + name[len(name) - (width - 3 - half) :]


def format_op_profile(
    profiles: dict[str, dict[str, tuple[float, float]]], labels: dict[str, str], top: int = 12
) -> str:
    """The ``top`` operators by their largest self time in any of ``profiles`` (from :func:`op_profile`),
    side by side: milliseconds and calls per unit of each, then the total self time of each."""
    names = list(profiles)
    ops = sorted(
        {op for p in profiles.values() for op in p},
        key=lambda op: -max(p.get(op, (0, 0))[0] for p in profiles.values()),
    )
    headers = ["operator"] + [f"{labels[n]} ms (calls)" for n in names]
    rows = []
    for op in ops[:top]:
        cells = [f"{profiles[n][op][0]:.2f} ({profiles[n][op][1]:.3g})" if op in profiles[n] else "-" for n in names]
        rows.append([_short(op), *cells])
    rows.append(["total self time", *(f"{sum(t for t, _ in profiles[n].values()):.2f}" for n in names)])
    return format_table(headers, rows)


# ---------------------------------------------------------------------------------------------
# Output
# ---------------------------------------------------------------------------------------------


def format_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A plain-text table with right-aligned columns, for the terminal."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _cell(values: dict[str, object]) -> str:
    """``k=v, k=v`` for a Markdown table cell (no pipes, no newlines)."""
    text = ", ".join(f"{k}={v}" for k, v in values.items())
    return text.replace("|", "/").replace("\n", " ")


def append_result(
    benchmark: str, settings: dict[str, object], results: dict[str, object], path: str | os.PathLike | None = None
) -> Path:
    """Append one dated row to the results table (creating the file with its header if needed).

    The one-minute load average is added to the settings: a busy machine makes timings noisy.
    """
    path = Path(path) if path is not None else RESULTS_FILE
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(RESULTS_HEADER)
    info = machine_info()
    date = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    load = load_average()
    settings = {**settings, "load": "?" if load is None else f"{load:.2f}"}  # others' work makes timings noisy
    row = [date, benchmark, info["machine"], info["python"], info["torch"], _cell(settings), _cell(results)]
    text = path.read_text()
    prefix = "" if text.endswith("\n") else "\n"
    with path.open("a") as f:
        f.write(prefix + "| " + " | ".join(row) + " |\n")
    return path


def load_average() -> float | None:
    """The one-minute load average (``None`` where the OS does not say)."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def add_record_flags(parser) -> None:
    """``--no-record`` and ``--results`` for every benchmark's command line."""
    parser.add_argument("--no-record", action="store_true", help="print only; append nothing to the results file")
    parser.add_argument("--results", default=None, metavar="PATH", help="results file (default: benchmarks/RESULTS.md)")
