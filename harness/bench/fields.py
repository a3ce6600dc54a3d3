"""The fields of results.jsonl, one line per run of a bench: each with what it holds.

This is the one list: report.py writes exactly these keys, and docs/reference/outputs.md's
table of them is generated from it (`python -m tests.docs_reference`), so a field added,
renamed or removed here changes the page, and a stale page fails the docs test.
"""

from __future__ import annotations

_PERCENTILES = ("`p50`/`p99`/`p999`/`max`/`count`, from HdrHistograms (1% buckets) merged over "
                "ranks; a percentile that too few samples back — p99 needs 100, p99.9 1000 — "
                "is null")

RESULT_FIELDS: dict[str, str] = {
    # what was run
    "variant": "the collective scheme (`reliable`, `unbiased_drift`, `rps`, ...; `/sgd` or "
               "`/adamw` when the optimizer is not the variant's default, `@TRANSPORT` when "
               "the transport is not `udp`)",
    "regime": "`finetune` (from the seed's lossless checkpoint) or `scratch`",
    "role": "why the run was made: `reference`, `lossy`, `twin` (the chaos check), "
            "`realisation` (another loss draw), `speed`, `speed_reference`",
    "profile": "the impairment profile applied during the run",
    "loss": "the target loss rate, a fraction",
    "loss_seed": "the seed of the loss draw",
    "seed": "the training seed (initialisation and data order)",
    "steps": "training steps",
    "hosts": "hosts (ranks)",
    "tokens_seen": "the tokens trained on, all ranks",
    # speed and tails
    "tokens_per_s": "training throughput over all ranks",
    "step_ms": "step time, ms: " + _PERCENTILES,
    "collective_ms": "the collectives' time per step, ms: " + _PERCENTILES,
    "warmup_step_ms": "per rank, the first steps' times (ms), left out of `step_ms`",
    "slow_steps": "the steady steps slower than a few medians: `rank`, `step`, `ms`, "
                  "`median_ms` and what the transport and the collective counted during it",
    "step_hist": "the merged step-time HdrHistogram, encoded: what `lossbed report` redraws "
                 "the CDF from",
    "run_s": "the run's wall time, set-up and evaluation included",
    "rank_max_rss_mb": "each rank's peak resident memory, MiB",
    "wait_for_all": "whether the run waited for every packet (a lossless reference of a lossy "
                    "collective)",
    # quality
    "ppl": "the headline held-out perplexity (which one: `headline`)",
    "headline": "which perplexity is the headline: `rank0`, `rank_mean` or `owners`",
    "ppl_rank0": "rank 0's model's held-out perplexity",
    "ppl_ranks": "every rank's model's held-out perplexity",
    "ppl_rank_mean": "the mean of `ppl_ranks`",
    "ppl_rank_worst": "the largest of `ppl_ranks`",
    "ppl_average_model": "the perplexity of the ranks' averaged parameters",
    "ppl_owners": "`unbiased_drift`: the perplexity of the owners' model (each shard from "
                  "its owner); null for the others",
    "ppl_delta_pct": "Δppl, %, against its reference of the same seed",
    "ce_per_token": "held-out cross-entropy per token (nats)",
    "bytes_per_token": "corpus bytes per token of the tokenizer",
    "bits_per_byte": "held-out bits per byte (tokenizer-independent)",
    "eval_tokens": "held-out tokens evaluated",
    "tokenizer": "the tokenizer (`bpe-...`)",
    "vocab_size": "the tokenizer's vocabulary size",
    "corpus_sha": "the corpus's SHA-256",
    "split_sha": "the held-out split's SHA-256",
    "heldout_windows": "held-out windows evaluated",
    "heldout_dropped": "held-out windows left out (too short)",
    "epochs": "passes over the training split",
    "losses": "the training loss per step",
    "model_sha": "the final model's SHA-256 (rank 0)",
    "progress_steps": "the lossless reliable references': [step, held-out ppl] every "
                      "`progress_every` steps but the last (the iso-progress curve)",
    "drift": "max over ranks of ||x_i − mean||, at the end",
    "drift_steps": "during training, every `drift_every` steps: [step, the largest "
                   "replica's distance from the owners' model for `unbiased_drift`, from the "
                   "ranks' mean for the others]",
    "drift_max": "the largest distance in `drift_steps`",
    # the impairment the traffic met
    "measured_loss": "the loss the kernel's counters measured over the run's packets",
    "measured_loss_interval": "its 95% interval",
    "measured_packets": "the packets counted",
    "measured_window": "what the counters covered: this run alone (at each run boundary rank 0 "
                       "waits while the controller reads them and applies the next profile)",
    "rcvbuf_drops": "the receivers' own UDP drops (full buffers), not the impairment's",
    "coverage": "the share of the hosts' bytes that crossed the impairment: `fraction`, "
                "`packet_fraction`, `min_coverage`, `enough`, `impaired_bytes`, "
                "`total_bytes`, `elsewhere` (where the rest went), and `hosts`, the same per "
                "host",
    "invalid": "null, or why the run is no result (too little of its traffic met the "
               "impairment); such a run is left out of `summary.json`'s rows and listed in "
               "its `invalid_runs`",
    "loss_applied_by": "what dropped packets: the kernel's backend, or the receivers' drop "
                       "mask",
    "exempt": "what of the run the impairment left out: its set-up, the evaluation, the "
              "always-reliable ports",
    "backend": "the kernel backend that applied the profile (`netem`, `bpf`, `nft`)",
    # the wire
    "transport_counters": "the transport's counters summed over ranks (datagrams sent, "
                          "received, missing, refused, ...)",
    "collective_totals": "the lossy collective's, summed over ranks: stages ended by their "
                         "deadline (`reduce_deadlines_hit`, `broadcast_deadlines_hit`), "
                         "`collective_steps`, `align_s`; empty for `reliable`",
    "packets_sent": "datagrams sent, all ranks",
    "packets_lost": "datagrams that did not arrive, all ranks",
    "bytes_sent": "bytes sent, all ranks",
    "authenticated": "every datagram sealed with the job's key",
    "wire_warning": "null, or what to know of the wire (such as unsealed datagrams)",
}
