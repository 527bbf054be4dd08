"""Bench results people look at: results JSON, a markdown summary (ratios first), PNG plots."""

from __future__ import annotations

import json
import os
from typing import Any

from harness.bench.model import higher_is_better

Doc = dict[str, Any]
# Figures in the ratio table (every figure is in the table of absolute values below it).
HEADLINE = ("tokens_per_s", "frontend_cpu_s_per_mtok", "client_cpu_s_per_mtok",
            "token_p50_ms", "token_p99_ms",
            "ttft_p50_ms", "ttft_p99_ms", "request_to_add_p50_ms", "first_sent_to_client_p50_ms",
            "all_aborted_ms", "abort_frames", "rtt_p50_ms", "rtt_p99_ms", "first_served_ms")


def write_json(doc: Doc, report_dir: str) -> str:
    path = os.path.join(report_dir, "bench.json")
    with open(path, "w") as fh:
        json.dump(doc, fh, indent=1)
    return path


def _figures(doc: Doc) -> dict[tuple[str, str, str], dict[str, float | None]]:
    """(scenario, row label, figure) -> {frontend: value}; refused rows give None."""
    out: dict[tuple[str, str, str], dict[str, float | None]] = {}
    for spec, fdoc in doc["frontends"].items():
        for sname, sdoc in fdoc["scenarios"].items():
            for row in sdoc.get("rows", []):
                for fig, value in row["figures"].items():
                    if fig == "samples":
                        continue
                    out.setdefault((sname, row["label"], fig), {})[spec] = value
    return out


def _fmt(value: float | None) -> str:
    if value is None:
        return "-"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.3g}" if abs(value) < 10 else f"{value:.1f}"


def render_markdown(doc: Doc) -> str:
    specs = list(doc["frontends"])
    first = specs[0] if specs else ""
    lines = [f"# corewire bench ({doc['started']})", "",
             f"Machine: {doc['machine']['cores']} cores, {doc['machine']['platform']}, Python "
             f"{doc['machine']['python']}; load average before {doc['load_before']}, after "
             f"{doc.get('load_after')}. Figures taken while an engine thread was busy more "
             f"than {doc['busy_limit']:.0%} of the time are refused (shown as REFUSED).", ""]
    figures = _figures(doc)
    if len(specs) > 1:
        lines += [f"## Ratios against {first} (> 1: better than {first}; tokens/s: X / "
                  f"{first}, costs: {first} / X)", "",
                  "| scenario | row | figure | " + " | ".join(specs[1:]) + " |",
                  "|---|---|---|" + "---|" * (len(specs) - 1)]
        for (sname, label, fig), values in figures.items():
            if not fig.endswith(HEADLINE):
                continue
            base = values.get(first)
            cells = []
            for spec in specs[1:]:
                value = values.get(spec)
                if base in (None, 0) or value in (None, 0):
                    cells.append("-")
                    continue
                assert base is not None and value is not None
                ratio = value / base if higher_is_better(fig) else base / value
                cells.append(f"{ratio:.2f}x")
            if any(cell != "-" for cell in cells):
                lines.append(f"| {sname} | {label} | {fig} | " + " | ".join(cells) + " |")
        lines.append("")
    lines += ["## Figures", "", "| scenario | row | figure | " + " | ".join(specs) + " |",
              "|---|---|---|" + "---|" * len(specs)]
    for (sname, label, fig), values in figures.items():
        lines.append(f"| {sname} | {label} | {fig} | "
                     + " | ".join(_fmt(values.get(s)) for s in specs) + " |")
    lines += ["", "## Engine load, refusals, notes and errors", ""]
    for spec in specs:
        for sname, sdoc in doc["frontends"][spec]["scenarios"].items():
            if sdoc.get("error"):
                lines.append(f"- {spec} / {sname}: ERROR {sdoc['error']}")
            for row in sdoc.get("rows", []):
                busy = row.get("engine_busy")
                extra = [f"engine busy {busy:.2f}"] if busy is not None else []
                if row.get("refused"):
                    extra.append(f"REFUSED: {row['refused']}")
                extra += row.get("notes", [])
                if row.get("params", {}).get("cpu_scope"):
                    extra.append(f"CPU scope: {row['params']['cpu_scope']}")
                lines.append(f"- {spec} / {sname} / {row['label']}: " + "; ".join(extra))
    return "\n".join(lines) + "\n"


def write_markdown(doc: Doc, report_dir: str) -> str:
    path = os.path.join(report_dir, "bench.md")
    with open(path, "w") as fh:
        fh.write(render_markdown(doc))
    return path


def write_plots(doc: Doc, report_dir: str) -> list[str]:
    """throughput.png (tokens/s vs concurrency) and one CDF per latency series."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written: list[str] = []
    specs = list(doc["frontends"])
    lines: dict[str, list[tuple[int, float]]] = {}
    for spec in specs:
        rows = doc["frontends"][spec]["scenarios"].get("throughput", {}).get("rows", [])
        points = [(r["params"]["streams"], r["figures"].get("tokens_per_s")) for r in rows]
        kept = [(x, y) for x, y in points if y is not None]
        if kept:
            lines[spec] = kept
    if lines:
        written.append(_throughput_plot(plt, lines, report_dir))
    written += _cdf_plots(plt, doc, report_dir)
    return written


def _throughput_plot(plt: Any, lines: dict[str, list[tuple[int, float]]],
                     report_dir: str) -> str:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for spec, points in lines.items():
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=spec)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("concurrent streams")
    ax.set_ylabel("tokens/s delivered to clients")
    ax.set_title("Streaming throughput (refused figures omitted)")
    ax.grid(True, alpha=0.3)
    ax.legend()
    path = os.path.join(report_dir, "throughput.png")
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return path


def _cdf_plots(plt: Any, doc: Doc, report_dir: str) -> list[str]:
    """One latency CDF per (scenario, row, series), one line per frontend."""
    written: list[str] = []
    specs = list(doc["frontends"])
    series: dict[tuple[str, str, str], dict[str, list[float]]] = {}
    for spec in specs:
        for sname, sdoc in doc["frontends"][spec]["scenarios"].items():
            for row in sdoc.get("rows", []):
                for name, values in row.get("samples", {}).items():
                    if values and name.endswith("_ms") and sname != "startup":
                        series.setdefault((sname, row["label"], name), {})[spec] = values
    for (sname, label, name), per_spec in series.items():
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for spec, values in per_spec.items():
            ordered = sorted(v for v in values if v > 0)  # a log axis has no zero
            if not ordered:
                continue
            ax.plot(ordered, [(i + 1) / len(ordered) for i in range(len(ordered))],
                    label=spec)
        ax.set_xscale("log")
        ax.set_xlabel(f"{name[:-3]} (ms, log scale)")
        ax.set_ylabel("fraction")
        ax.set_title(f"{sname}: {label}")
        ax.grid(True, alpha=0.3)
        ax.legend()
        slug = "".join(c if c.isalnum() else "-" for c in f"{sname}-{label}-{name[:-3]}")
        path = os.path.join(report_dir, f"cdf-{slug}.png")
        fig.savefig(path, dpi=100, bbox_inches="tight")
        plt.close(fig)
        written.append(path)
    return written
