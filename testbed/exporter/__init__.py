"""lossbed's measurements, live, for Prometheus: the impairment (impairment.py) and a run's
progress (harness/live_metrics.py), served on one HTTP endpoint (server.py) while a command
holds an impairment, or by `lossbed metrics`. docs/guides/monitoring.md."""
