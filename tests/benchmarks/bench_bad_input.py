"""Bad input across every command, as a newcomer types it (#57): each one's exit code, wall
time and the first line it printed, as a markdown table; a traceback or an exit 0 is
flagged, and a refusal slower than --limit-s is said beside it (a time depends on how busy
the machine is: it fails nothing, #71). Nothing here may touch a cluster: every command
that could names a cluster that does not exist (--cluster nosuch) or an inventory that
cannot be read, so the worst a missed check can do is end on "not up".

    .venv/bin/python -m tests.benchmarks.bench_bad_input [--limit-s 1.0] [--out FILE]

Exit 1 when any input is flagged (a traceback, or an exit 0 on bad input).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
NO = ["--cluster", "nosuch"]


def fixtures(folder: Path) -> dict[str, str]:
    """Files a user gets wrong: profiles, inventories, results, a script, paths."""
    made = {
        "yaml_syntax": "impairment:\n  loss: [1, 2\n",
        "loss_number": "impairment:\n  loss: 5\n",
        "unknown_field": "impairment:\n  loss:\n    model: bernoulli\n    loss_pct: 1\n  "
                         "jitter_msec: 3\n",
        "negative_delay": "impairment:\n  delay_ms: -4\n",
        "percent_text": "impairment:\n  loss:\n    model: bernoulli\n    loss_pct: 10%\n",
        "over_100": "impairment:\n  loss:\n    model: bernoulli\n    loss_pct: 140\n",
        "not_a_mapping": "- just\n- a list\n",
        "empty": "",
        "binary": "\x00\x01\x02",
        "inv_syntax": "all: [hosts\n",
        "inv_no_hosts": "all:\n  hosts: {}\n",
        "inv_bad_name": "all:\n  hosts:\n    ../etc:\n      ansible_host: 10.0.0.1\n",
        "inv_bad_address": "all:\n  hosts:\n    h1:\n      ansible_host: 10.0.0.999\n",
        "inv_bad_iface": "all:\n  hosts:\n    h1:\n      ansible_host: 10.0.0.1\n      "
                         "lossbed_interface: 'eth0;rm'\n",
        "results_binary": "\xff\xfe\x00",
        "results_shape": '{"a": 1}\n',
        "summary_no_rows": '{"rows": 3}\n',
    }
    paths = {}
    for name, text in made.items():
        suffix = ".jsonl" if name.startswith("results") else ".json" \
            if name.startswith("summary") else ".yml"
        path = folder / f"{name}{suffix}"
        path.write_bytes(text.encode("latin-1"))
        paths[name] = str(path)
    for name in ("results_binary", "results_shape"):
        bench = folder / f"bench_{name}"
        bench.mkdir()
        (bench / "results.jsonl").write_bytes(Path(paths[name]).read_bytes())
        paths[f"bench_{name}"] = str(bench)
    paths["a_file"] = str(folder / "a_file")
    Path(paths["a_file"]).write_text("x")
    return paths


def inputs(f: dict[str, str]) -> list[list[str]]:
    return [
        # up / down / status / exec
        ["up"], ["up", "--hosts", "0"], ["up", "--hosts", "-2"], ["up", "--hosts", "two"],
        ["up", "--hosts", "2", "--name", "../x"], ["up", "--hosts", "2", "--name", "a b"],
        ["up", "--hosts", "2", "--mtu", "10"], ["up", "--hosts", "2", "--subnet", "300.1/8"],
        ["up", "--hosts", "2", "--kind", "docker"], ["up", "--hosts", "9999"],
        ["down", "../etc"], ["down", "a/b"], ["status", "../x"], ["status", "nosuch"],
        ["exec", "nosuch", "h1", "true"], ["exec", *NO, "h1"],
        # apply / clear / show / verify
        ["apply", *NO], ["apply", "nosuch-profile", *NO], ["apply", f["yaml_syntax"], *NO],
        ["apply", f["loss_number"], *NO], ["apply", f["unknown_field"], *NO],
        ["apply", f["negative_delay"], *NO], ["apply", f["percent_text"], *NO],
        ["apply", f["over_100"], *NO], ["apply", f["not_a_mapping"], *NO],
        ["apply", f["empty"], *NO], ["apply", f["binary"], *NO],
        ["apply", "random-loss", "--loss", "10", *NO],
        ["apply", "random-loss", "--loss", "10%", *NO],
        ["apply", "random-loss", "--loss", "-0.1", *NO],
        ["apply", "random-loss", "--loss", "nan", *NO],
        ["apply", "random-loss", "--set", "loss_pct", *NO],
        ["apply", "random-loss", "--set", "nosuch=1", *NO],
        ["apply", "random-loss", "--set", "delay_ms=abc", *NO],
        ["apply", "random-loss", "--loss", "0.1", "--set", "loss_pct=5", *NO],
        ["apply", "random-loss", "--json", *NO],
        ["apply", "random-loss", "--lease-s", "0", "--inventory", "/nonexistent.yml"],
        ["apply", "random-loss", "--only", "h9", *NO],
        ["apply", "random-loss", "--inventory", f["inv_syntax"]],
        ["apply", "random-loss", "--inventory", f["inv_no_hosts"]],
        ["apply", "random-loss", "--inventory", f["inv_bad_name"]],
        ["apply", "random-loss", "--inventory", f["inv_bad_address"]],
        ["apply", "random-loss", "--inventory", f["inv_bad_iface"]],
        ["apply", "random-loss", "--inventory", "/nonexistent.yml"],
        ["clear", *NO], ["clear", "--cluster", "../x"], ["show", *NO], ["verify", *NO],
        ["verify", "--cluster", "a/b"],
        # doctor / renew / inventory
        ["doctor", *NO], ["doctor", "--set", "loss=0.1", *NO],
        ["doctor", "--profile", "nosuch-profile", *NO], ["doctor", "--loss", "0.1", *NO],
        ["doctor", "--device", "tpu", *NO], ["renew", *NO], ["renew", "--lease-s", "-1", *NO],
        ["inventory", *NO], ["inventory", "--cluster", "../x"],
        # train
        ["train", *NO], ["train", "--steps", "0", *NO], ["train", "--steps", "x", *NO],
        ["train", "--seed", "-3", *NO], ["train", "--lr", "nan", *NO],
        ["train", "--lr", "-1", *NO], ["train", "--loss", "1.5", *NO],
        ["train", "--loss", "10%", *NO], ["train", "--variant", "nosuch", *NO],
        ["train", "--preset", "huge", *NO], ["train", "--eval-tokens", "-1", *NO],
        ["train", "--corpus", "/nonexistent.txt", *NO], ["train", "--corpus", f["empty"], *NO],
        ["train", "--hf-dataset", "/nonexistent", *NO],
        ["train", "--json", "/nonexistent/dir/x.jsonl", *NO],
        ["train", "--save-model", f["a_file"], *NO], ["train", "--grace-s", "0", *NO],
        ["train", "--transport", "tcp", *NO], ["train", "--device", "tpu", *NO],
        ["train", "--profile", f["yaml_syntax"], *NO],
        ["train", "--inventory", f["inv_syntax"]],
        # bench
        ["bench", "--loss", "10", *NO], ["bench", "--loss", "10%", *NO],
        ["bench", "--loss", "abc", *NO], ["bench", "--hosts", "1", *NO],
        ["bench", "--steps", "0", *NO], ["bench", "--seeds", "0", *NO],
        ["bench", "--variants", "nosuch", *NO], ["bench", "--profile", "clean", *NO],
        ["bench", "--profile", "nosuch-profile", *NO], ["bench", "--band-pct", "-1", *NO],
        ["bench", "--min-coverage", "2", *NO], ["bench", "--regime", "nosuch", *NO],
        ["bench", "--sgd-lr", "0", *NO], ["bench", "--out", f["a_file"], *NO],
        ["bench", "--out", f"{f['a_file']}/x", *NO], ["bench", "--speed-seeds", "0", *NO],
        ["bench", "--mtu", "10", *NO],
        # run
        ["run", *NO], ["run", *NO, "--", "python", "x.py"],
        ["run", *NO, "--", "torchrun"], ["run", *NO, "--", "torchrun", "--nnodes", "2", "x.py"],
        ["run", "--", "torchrun", "x.py", "--cluster", "c1"],
        ["run", *NO, "--impair-from", "later", "--", "torchrun", "x.py"],
        ["run", *NO, "--transport", "verbs-ud", "--", "torchrun", "x.py"],
        ["run", *NO, "--grace-s", "-1", "--", "torchrun", "x.py"],
        ["run", *NO, "--loss", "3", "--", "torchrun", "x.py"],
        ["run", *NO, "--min-coverage", "-0.5", "--", "torchrun", "x.py"],
        # report / compare / reproduce / collective-bench
        ["report", "/nonexistent"], ["report", f["a_file"]],
        ["report", f["bench_results_binary"]], ["report", f["bench_results_shape"]],
        ["compare", "/nonexistent/a", "/nonexistent/b"],
        ["compare", f["summary_no_rows"], f["summary_no_rows"]],
        ["compare", f["a_file"], f["a_file"]],
        ["compare", "/nonexistent/a", "/nonexistent/b", "--threshold-pct", "-5"],
        ["compare", "/nonexistent/a", "/nonexistent/b", "--ppl-points", "nan"],
        ["reproduce", "--rows", "99"], ["reproduce", "--rows", "x"],
        ["reproduce", "--out", f["a_file"]],
        ["collective-bench", *NO, "--hosts", "1"], ["collective-bench", *NO, "--sizes", "0"],
        ["collective-bench", *NO, "--profiles", "nosuch"],
        ["collective-bench", *NO, "--iters", "0"],
        ["collective-bench", *NO, "--loss", "2"],
        ["collective-bench", *NO, "--json", "/nonexistent/dir/x"],
        ["collective-bench", *NO, "--align-every", "-1"],
        ["collective-bench", *NO, "--algorithms", "nosuch"],
        # the command itself
        [], ["nosuch"], ["--cluster", "x", "apply"], ["apply", "--bogus", *NO],
    ]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--limit-s", type=float, default=1.0)
    parser.add_argument("--out", help="write the table here too")
    args = parser.parse_args()
    rows, flagged = [], 0
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        env = {**os.environ, "PYTHONPATH": str(REPO), "LOSSBED_STATE_DIR": str(folder / "state")}
        cases = inputs(fixtures(folder))
        for argv in cases:
            started = time.perf_counter()
            done = subprocess.run([sys.executable, "-m", "harness.cli", *argv], cwd=folder,
                                  env=env, capture_output=True, text=True, timeout=120)
            took = time.perf_counter() - started
            said = (done.stderr.strip() or done.stdout.strip()).splitlines()
            first = next((line for line in said if "error" in line), said[0] if said else "")
            problems = [why for why, bad in (("traceback", "Traceback" in done.stderr),
                                             ("exit 0", done.returncode == 0)) if bad]
            # a slow refusal is said, not failed on: it depends on how busy the machine is
            slow = [f"over {args.limit_s:g} s"] if took > args.limit_s else []
            flagged += bool(problems)
            problems += slow
            shown = " ".join(a if len(a) < 30 else "…" + a[-20:] for a in argv)
            rows.append(f"| `lossbed {shown}` | {done.returncode} | {took:.2f} | "
                        f"{first[:110].replace('|', '/')} | {', '.join(problems)} |")
    table = "\n".join(["| input | exit | s | first line | flagged |", "|---|---|---|---|---|",
                       *rows])
    summary = (f"{len(rows)} inputs, {flagged} flagged; slowest "
               f"{max(float(r.split('|')[3]) for r in rows):.2f} s")
    print(table + "\n\n" + summary)
    if args.out:
        Path(args.out).write_text(table + "\n\n" + summary + "\n")
    print(json.dumps({"inputs": len(rows), "flagged": flagged}), file=sys.stderr)
    return 1 if flagged else 0


if __name__ == "__main__":
    sys.exit(main())
