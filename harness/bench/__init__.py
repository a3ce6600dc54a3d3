"""Benchmarks that run on a cluster: the collective bench and (later) the training bench."""
