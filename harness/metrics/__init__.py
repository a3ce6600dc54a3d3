"""Measurements of a run: latency histograms, throughput, counters, drift."""
