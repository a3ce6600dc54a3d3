"""lossbed's training side: transports, lossy collectives, model and data, metrics, bench."""
