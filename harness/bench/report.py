"""What a bench leaves behind: results.jsonl (one line per run, with what every plot needs),
summary.json (summary.py), the plots (plots.py), summary.md (table.py's table and the plots),
and report.html: one self-contained page to share (the answer table, every plot embedded,
the regime, the config and the provenance). `lossbed report DIR` redraws all but the first
two from them."""

from __future__ import annotations

import base64
import html
import json
import platform
from pathlib import Path

from harness.bench.fields import RESULT_FIELDS
from harness.bench.plots import plots
from harness.bench.summary import verdict_cell
from harness.bench.table import table
from harness.metrics.verdict import BAND_PCT
from testbed import version


def write_outputs(out: Path, records: list[dict], summary: dict) -> None:
    with open(out / "results.jsonl", "w") as f:
        for r in records:
            f.write(json.dumps({k: r.get(k) for k in RESULT_FIELDS}) + "\n")
    summary.setdefault("provenance", provenance(records))
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    redraw(out, records, summary)


def redraw(out: Path, records: list[dict], summary: dict) -> list[str]:
    """The plots, summary.md and report.html from a bench's records and summary."""
    names = plots(out, records, summary)
    text = table(summary)
    (out / "summary.md").write_text(
        "# lossbed bench\n\n```\n" + text + "\n```\n\n"
        + "".join(f"![{name}]({name})\n\n" for name in names)
        + "Config: `" + json.dumps(summary["config"]) + "`\n")
    (out / "report.html").write_text(html_report(out, summary, names, text))
    return names


def load(folder: Path) -> tuple[list[dict], dict]:
    """A bench folder's records and summary (what `lossbed report DIR` redraws from)."""
    from testbed.errors import UsageError

    folder = Path(folder)
    results, summary = folder / "results.jsonl", folder / "summary.json"
    if not results.is_file() or not summary.is_file():
        raise UsageError("DIR", f"{folder} holds no bench (results.jsonl and summary.json)",
                         "Give the folder a bench wrote (results/bench-TIME)")
    try:
        records = [json.loads(line) for line in results.read_text().splitlines() if line]
        return records, json.loads(summary.read_text())
    except json.JSONDecodeError as err:
        raise UsageError("DIR", f"{folder}: a file is not JSON ({err})",
                         "Give a folder a bench wrote, unchanged") from None


def provenance(records: list[dict]) -> dict:
    """Where the numbers come from: the code's commit, the versions, the hosts."""
    from importlib import metadata

    versions = {"python": platform.python_version()}
    for package in ("torch", "transformers", "lossbed"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            pass
    return {"commit": version.commit(), "versions": versions, "machine": platform.node(),
            "kernel": platform.release(),
            "hosts": max((r.get("hosts") or 0 for r in records), default=0)}


def _answer_rows(summary: dict) -> str:
    cells = []
    for r in summary["rows"]:
        delta = ("-" if r.get("ppl_delta_pct") is None else
                 f"{r['ppl_delta_pct']:+.2f}%" + (f" ± {r['ppl_delta_ci95']:.2f}"
                                                   if r.get("ppl_delta_ci95") else ""))
        speed = r.get("throughput_vs_reliable")
        p99 = r.get("p99_vs_reliable")
        measured, covered = r.get("measured_loss"), r.get("coverage")
        values = [f"{r['loss']:.0%}", r["variant"], delta, verdict_cell(r),
                  "-" if speed is None else f"{speed:.2f}×", "-" if p99 is None else f"{p99:.2f}×",
                  "-" if measured is None else f"{measured:.2%}",
                  "-" if covered is None else f"{covered:.1%}", str(r["seeds"])]
        cells.append("<tr>" + "".join(f"<td>{html.escape(v)}</td>" for v in values) + "</tr>")
    return "\n".join(cells)


def html_report(out: Path, summary: dict, images: list[str], printed: str) -> str:
    """One self-contained page: every plot embedded (data URIs), nothing fetched; printed:
    the table as the bench printed it (table.py)."""
    figures = []
    for name in images:
        data = base64.b64encode((out / name).read_bytes()).decode()
        figures.append(f'<figure><img alt="{html.escape(name)}" '
                       f'src="data:image/png;base64,{data}"><figcaption>'
                       f"{html.escape(name)}</figcaption></figure>")
    prov = summary.get("provenance") or {}
    versions = ", ".join(f"{k} {v}" for k, v in (prov.get("versions") or {}).items())
    head = ("<tr><th>loss</th><th>variant</th><th>Δppl vs lossless (95%)</th>"
            f"<th>verdict vs ±{summary.get('band_pct', BAND_PCT):g}%</th>"
            "<th>tokens/s vs reliable</th><th>step p99 vs reliable</th>"
            "<th>measured loss</th><th>coverage</th><th>seeds</th></tr>")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>lossbed bench</title>
<style>body{{font-family:sans-serif;max-width:60em;margin:2em auto;padding:0 1em}}
table{{border-collapse:collapse}}td,th{{border:1px solid #bbb;padding:.25em .6em;
text-align:right}}img{{max-width:100%}}pre{{background:#f4f4f4;padding:.6em;
overflow-x:auto;font-size:80%}}figure{{margin:1.5em 0}}</style></head>
<body><h1>lossbed bench</h1>
<p>{html.escape(summary.get("regime") or "")}; backend {html.escape(str(summary.get("backend")))};
noise floor ±{summary.get("noise_floor_pct") or 0:.2f} points.</p>
<h2>The answer</h2><table>{head}
{_answer_rows(summary)}</table>
<h2>Plots</h2>{"".join(figures)}
<h2>The table as printed</h2><pre>{html.escape(printed)}</pre>
<h2>Provenance</h2><p>commit {html.escape(str(prov.get("commit")))}; {html.escape(versions)};
{prov.get("hosts")} hosts; kernel {html.escape(str(prov.get("kernel")))}</p>
<h2>Config</h2><pre>{html.escape(json.dumps(summary.get("config"), indent=1))}</pre>
</body></html>
"""
