"""What `lossbed run` leaves beside its summary.json, as a bench does: summary.md and
report.html (what was asked, what the kernel lost, how much of the traffic met the
impairment, speed and tail, and the script's own figures); and `lossbed compare RUN_A
RUN_B`: two runs side by side (a reliable run and a lossy one, say), each figure with the
second's ratio to the first. `lossbed report DIR` redraws the first two."""

from __future__ import annotations

import html
import json
import math
from pathlib import Path


def is_run(summary: dict) -> bool:
    """A `lossbed run` summary (a bench's has rows)."""
    return isinstance(summary, dict) and "command" in summary and "rows" not in summary


def _pct(x) -> str:
    return "-" if x is None else f"{x:.2%}"


def _ms(summary: dict, key: str, q: str):
    return (summary.get(key) or {}).get(q)


def figures(summary: dict) -> list[tuple[str, object]]:
    """(label, value) of one run, in the order the report shows them; numbers stay numbers
    (compare divides them)."""
    interval = summary.get("measured_loss_interval")
    coverage = (summary.get("coverage") or {}).get("fraction")
    rows = [("command", summary.get("command")), ("profile", summary.get("profile")),
            ("loss asked (--loss)", "the profile's own" if summary.get("loss") is None
             else summary["loss"]),
            ("measured loss", summary.get("measured_loss")),
            ("its 95% interval", None if not interval else
             f"{_pct(interval[0])} - {_pct(interval[1])}"),
            ("coverage", coverage), ("missing fraction", summary.get("missing_fraction")),
            ("exit code", summary.get("exit_code")), ("timed out", summary.get("timed_out")),
            ("stopped by", summary.get("stopped_by")), ("ranks", summary.get("ranks")),
            ("steps", summary.get("steps")), ("tokens/s", summary.get("tokens_per_s")),
            ("steps/s", summary.get("steps_per_s")),
            ("replicas' drift (largest)", summary.get("drift"))]
    for key, label in (("step_ms", "step"), ("collective_ms", "collective")):
        for q in ("p50", "p99", "max"):
            rows.append((f"{label} {q} ms", _ms(summary, key, q)))
    rows += [(f"script: {k}", v) for k, v in sorted((summary.get("script") or {}).items())
             if isinstance(v, int | float | str | bool)]
    return rows


def _shown(label: str, value) -> str:
    if value is None:
        return "-"
    if label in ("measured loss", "coverage", "missing fraction") and isinstance(value, float):
        return _pct(value)
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def table(summary: dict) -> str:
    rows = figures(summary)
    width = max(len(label) for label, _ in rows)
    return "\n".join(f"{label:<{width}}  {_shown(label, value)}" for label, value in rows)


def write(out: Path, summary: dict) -> None:
    """summary.md and report.html beside the run's summary.json."""
    text = table(summary)
    (out / "summary.md").write_text(f"# lossbed run\n\n```\n{text}\n```\n")
    cells = "\n".join(f"<tr><th>{html.escape(label)}</th><td>{html.escape(_shown(label, v))}"
                      "</td></tr>" for label, v in figures(summary))
    (out / "report.html").write_text(
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>lossbed run'
        "</title><style>body{font-family:sans-serif;max-width:60em;margin:2em auto}"
        "td,th{border:1px solid #bbb;padding:.25em .6em;text-align:left}"
        "table{border-collapse:collapse}pre{background:#f4f4f4;padding:.6em}</style></head>"
        f"<body><h1>lossbed run</h1><table>{cells}</table>"
        f"<h2>summary.json</h2><pre>{html.escape(json.dumps(summary, indent=1))}</pre>"
        "</body></html>\n")


def side_by_side(a: dict, b: dict, names: tuple[str, str] = ("A", "B")) -> str:
    """Two runs' figures side by side, with B's ratio to A where both are numbers."""
    left, right = dict(figures(a)), dict(figures(b))
    labels = list(left) + [k for k in right if k not in left]
    width = max(len(label) for label in labels)
    lines = [f"{'':<{width}}  {names[0]:>14}  {names[1]:>14}  {'B/A':>7}"]
    for label in labels:
        x, y = left.get(label), right.get(label)
        ratio = (f"{y / x:.3f}" if all(isinstance(v, int | float) and not isinstance(v, bool)
                                       for v in (x, y)) and x and math.isfinite(y / x) else "")
        if label == "command":
            lines.append(f"{label:<{width}}  A: {x}")
            lines.append(f"{'':<{width}}  B: {y}")
            continue
        lines.append(f"{label:<{width}}  {_shown(label, x):>14}  {_shown(label, y):>14}  "
                     f"{ratio:>7}")
    return "\n".join(lines)


def kind_of(path: Path) -> str:
    """What a folder (or its summary.json / reproduction.json) holds: "run", "bench" or
    "many-rank" (bench --many-rank's, or reproduce's, reproduction.json)."""
    path = Path(path)
    folder = path if path.is_dir() else path.parent
    if path.name == "reproduction.json" or (path.is_dir()
                                            and (folder / "reproduction.json").is_file()):
        return "many-rank"
    summary = folder / "summary.json" if path.is_dir() else path
    try:
        loaded = json.loads(summary.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return "bench"  # (the bench's own loader names what is wrong)
    return "run" if is_run(loaded) else "bench"


def claims_side_by_side(a: dict, b: dict) -> str:
    """Two reproductions' (or bench --many-rank's) rows side by side: each row's verdict and
    measured value in both."""
    left = {c["row"]: c for c in a.get("claims", [])}
    right = {c["row"]: c for c in b.get("claims", [])}
    lines = [f"{'row':<10} {'A: measured':>14} {'A: verdict':<14} {'B: measured':>14} "
             "B: verdict"]
    for row in list(left) + [r for r in right if r not in left]:
        cells = []
        for side in (left, right):
            claim = side.get(row)
            if claim is None:
                cells += [f"{'-':>14}", f"{'-':<14}"]
                continue
            value = claim["measured"]["measured"]
            cells += [f"{value:>+14.4g}" if isinstance(value, int | float) else f"{'-':>14}",
                      f"{claim['verdict']:<14}"]
        lines.append(f"{row:<10} " + " ".join(cells))
    return "\n".join(lines)


def redraw(folder: Path, kind: str) -> str:
    """`lossbed report DIR` for a run's folder or a many-rank one: what it wrote."""
    if kind == "run":
        write(folder, json.loads((folder / "summary.json").read_text()))
        return "summary.md, report.html"
    from harness.reproduce import report as reproduced

    reproduced.write(folder, json.loads((folder / "reproduction.json").read_text()))
    return "reproduction.md"


def compare_folders(base: Path, new: Path) -> str:
    """`lossbed compare` of two runs, or of two many-rank folders: side by side."""
    from testbed.errors import UsageError

    kinds = {kind_of(base), kind_of(new)}
    if len(kinds) > 1:
        raise UsageError("BASE/NEW", f"{base} and {new} are not of one kind "
                         f"({' and '.join(sorted(kinds))})", "Compare two runs, two benches, "
                         "or two bench --many-rank folders")
    name = "summary.json" if kinds == {"run"} else "reproduction.json"
    a, b = (json.loads((p / name if p.is_dir() else p).read_text()) for p in (base, new))
    return side_by_side(a, b) if kinds == {"run"} else claims_side_by_side(a, b)

