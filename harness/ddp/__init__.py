"""Training without model or optimizer changes: a DDP communication hook (gradient mode), a
sharded-optimizer wrapper (parameter mode), and RPS model averaging."""
