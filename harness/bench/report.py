"""What a bench leaves behind: results.jsonl (one line per run), summary.json (summary.py),
summary.md (table.py) and the plots (plots.py)."""

from __future__ import annotations

import json
from pathlib import Path

from harness.bench.plots import plots
from harness.bench.table import table

RESULT_FIELDS = ("variant", "regime", "tokens_seen", "role", "profile", "loss", "loss_seed",
                 "seed", "steps", "hosts",
                 "tokens_per_s", "step_ms", "collective_ms", "warmup_step_ms", "slow_steps",
                 "ppl", "headline", "ppl_rank0", "ppl_ranks", "ppl_rank_mean",
                 "ppl_rank_worst", "ppl_average_model", "ppl_owners", "ce_per_token",
                 "bytes_per_token", "bits_per_byte", "eval_tokens", "tokenizer", "vocab_size",
                 "corpus_sha", "split_sha", "heldout_windows", "heldout_dropped", "epochs",
                 "transport_counters", "ppl_delta_pct",
                 "measured_loss", "measured_loss_interval", "measured_packets", "rcvbuf_drops",
                 "measured_window", "drift", "backend",
                 "packets_sent", "packets_lost", "bytes_sent", "losses", "model_sha",
                 "authenticated", "wire_warning", "rank_max_rss_mb", "exempt", "run_s",
                 "wait_for_all")


def write_outputs(out: Path, records: list[dict], summary: dict) -> None:
    with open(out / "results.jsonl", "w") as f:
        for r in records:
            f.write(json.dumps({k: r.get(k) for k in RESULT_FIELDS}) + "\n")
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    text = table(summary)
    (out / "summary.md").write_text(
        "# lossbed bench\n\n```\n" + text + "\n```\n\nConfig: `"
        + json.dumps(summary["config"]) + "`\n\nPlots: loss_curves.png, step_time_cdf.png"
        + (", ppl_vs_loss.png" if len({r["loss"] for r in summary["rows"]}) > 2 else "")
        + "\n")
    plots(out, records, summary)
