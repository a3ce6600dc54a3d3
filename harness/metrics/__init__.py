"""Measurements of a run: latency histograms, throughput, counters, drift; and the verdict
that judges a measurement against a claim (verdict.py)."""
