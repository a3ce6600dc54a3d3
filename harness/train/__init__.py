"""`lossbed train`: one training run across a cluster, under an impairment profile."""
