"""The many-rank mode (#58): N ranks' data-parallel training in one process, the production
optimizers and rebuild code fed by per-packet fates drawn from the loss process, so the
statistics of 64 ranks can be measured on one machine. memory.py: the collective; fates.py:
which packets arrive; training.py: the ranks' training."""
