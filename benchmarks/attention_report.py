"""Reporting for ``benchmarks.attention``: the table, the summary row, the JSON file and the figure."""

from __future__ import annotations

import datetime
import json
from pathlib import Path

from .common import HERE, format_table, machine_info

JSON_FILE = HERE / "attention_scaling.json"
PASSES = ("forward", "forward+backward")
VARIANTS = ("handwritten", "fused", "direct")


def _find(rows: list[dict], **match) -> dict | None:
    return next((r for r in rows if all(r[k] == v for k, v in match.items())), None)


def _ms(row: dict | None) -> str:
    return "-" if row is None or row["time_s"] is None else f"{1000 * row['time_s']:.3g}"


def _mb(n: int | None) -> str:
    return "-" if n is None else f"{n / 2**20:.3g}"


def _ratio(a: dict | None, b: dict | None) -> float | None:
    if a is None or b is None or a["time_s"] is None or b["time_s"] is None:
        return None
    return a["time_s"] / b["time_s"]


def report(result: dict) -> str:
    """One table per dtype and pass: times in ms, ratios, peak memory and score-matrix size in MiB."""
    rows, out = result["rows"], []
    s = result["settings"]
    for dtype in s["dtypes"]:
        for pass_ in PASSES:
            table = []
            for T in s["seq_lens"]:
                hw, fu, di = (_find(rows, dtype=dtype, T=T, variant=v, **{"pass": pass_}) for v in VARIANTS)
                hw_fu, fu_di = _ratio(hw, fu), _ratio(fu, di)
                table.append(
                    [
                        T, _ms(hw), _ms(fu), _ms(di),
                        "-" if hw_fu is None else f"{hw_fu:.2f}", "-" if fu_di is None else f"{fu_di:.3f}",
                        _mb(hw["peak_bytes"]), _mb(fu["peak_bytes"]), _mb(di["peak_bytes"]), _mb(hw["score_bytes"]),
                        "/".join(str(r["reps"]) for r in (hw, fu, di)),
                    ]
                )  # fmt: skip
            headers = [
                "T", "hand ms", "fused ms", "direct ms", "hand/fused", "fused/direct",
                "hand MiB", "fused MiB", "direct MiB", "scores MiB", "reps h/f/d",
            ]  # fmt: skip
            out.append(f"{dtype}, {pass_} (B={s['batch_size']}, d_model={s['d_model']}, h={s['n_heads']}):")
            out.append(format_table(headers, table))
            here = [r for r in rows if r["dtype"] == dtype and r["pass"] == pass_ and r["skipped"]]
            notes = sorted({f"{r['variant']} at T={r['T']}: {r['skipped']}" for r in here})
            out.extend(f"  {n}" for n in notes)
            out.append("")
    return "\n".join(out)


def summary(result: dict) -> dict[str, str]:
    """The few numbers that go into the results file."""
    rows, s = result["rows"], result["settings"]
    out = {}
    for dtype in s["dtypes"]:
        tag = "" if dtype == "float32" else f"{dtype}_"
        for pass_, short in zip(PASSES, ("fwd", "fwdbwd"), strict=True):
            ratios = {}
            for T in s["seq_lens"]:
                fu, di = (_find(rows, dtype=dtype, T=T, variant=v, **{"pass": pass_}) for v in ("fused", "direct"))
                r = _ratio(fu, di)
                if r is not None:
                    ratios[T] = r
            if ratios:
                within = sum(abs(r - 1) <= 0.05 for r in ratios.values())
                out[f"{tag}fused/direct_{short}"] = f"{min(ratios.values()):.3f}..{max(ratios.values()):.3f}"
                out[f"{tag}within5%_{short}"] = f"{within}/{len(ratios)}"
            speedups = {}
            for T in s["seq_lens"]:
                hw, fu = (_find(rows, dtype=dtype, T=T, variant=v, **{"pass": pass_}) for v in ("handwritten", "fused"))
                r = _ratio(hw, fu)
                if r is not None:
                    speedups[T] = (r, hw, fu)
            if speedups:
                T = max(speedups)
                r, hw, fu = speedups[T]
                out[f"{tag}hand/fused_{short}@T={T}"] = f"{r:.2f}x"
                if hw["peak_bytes"] is not None and fu["peak_bytes"] is not None:
                    out[f"{tag}peak_MiB_{short}@T={T}"] = f"hand {_mb(hw['peak_bytes'])} fused {_mb(fu['peak_bytes'])}"
    return out


def save_json(result: dict, path: str | Path = JSON_FILE) -> Path:
    """Write ``result`` under its device's key (``"cpu"`` or ``"cuda"``), keeping the other device's numbers."""
    path = Path(path)
    data = json.loads(path.read_text()) if path.is_file() else {}
    data[result["settings"]["device"]] = {
        **machine_info(),
        "date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"),
        **result,
    }
    path.write_text(json.dumps(data, indent=1) + "\n")
    return path


def plot(result: dict, path: str | Path, dtype: str = "float32") -> Path:
    """Time and peak memory against T, log-log, hand-written against fused (the GPT chapter's figure)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows, s = result["rows"], result["settings"]
    styles = {"handwritten": ("C3", "hand-written"), "fused": ("C0", "fused")}
    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(10, 4), constrained_layout=True)
    for variant, (color, label) in styles.items():
        for pass_, line in zip(PASSES, ("--", "-"), strict=True):
            pts = [r for r in rows if r["variant"] == variant and r["pass"] == pass_ and r["dtype"] == dtype]
            t_pts = [(r["T"], r["time_s"] * 1000) for r in pts if r["time_s"] is not None]
            m_pts = [(r["T"], r["peak_bytes"] / 2**20) for r in pts if r["peak_bytes"]]
            if t_pts:
                ax_t.plot(*zip(*t_pts, strict=True), line, marker="o", ms=3, color=color, label=f"{label}, {pass_}")
            if m_pts:
                ax_m.plot(*zip(*m_pts, strict=True), line, marker="o", ms=3, color=color, label=f"{label}, {pass_}")
    scores = sorted({(r["T"], r["score_bytes"] / 2**20) for r in rows if r["dtype"] == dtype})
    ax_m.plot(*zip(*scores, strict=True), ":", color="gray", label="one score matrix, B·h·T²·bytes")
    for ax, ylabel in ((ax_t, "time per call (ms)"), (ax_m, "peak memory (MiB)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(s["seq_lens"], [str(T) for T in s["seq_lens"]])
        ax.set_xlabel("sequence length T")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="major", alpha=0.3)
    ax_t.legend(fontsize=7)
    ax_m.legend(fontsize=7)
    where = "GPU" if s["device"] == "cuda" else f"CPU, {s['threads']} thread{'s' if s['threads'] > 1 else ''}"
    fig.suptitle(
        f"Causal self-attention, B={s['batch_size']}, d_model={s['d_model']}, h={s['n_heads']}, {dtype}, {where}\n"
        "hand-written (tl.scaled_dot_product_attention) vs fused (F.scaled_dot_product_attention)",
        fontsize=9,
    )
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
