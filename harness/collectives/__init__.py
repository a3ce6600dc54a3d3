"""Where packets are rebuilt into tensors: the lossy all-reduce (reduce-scatter + broadcast)
with its estimators for what did not arrive (rebuild.py), RPS, and the reliable baseline."""
