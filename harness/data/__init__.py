"""Training text: the corpus, its train/held-out split, and each rank's batches."""
