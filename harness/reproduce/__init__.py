"""`lossbed reproduce`: the two papers' claims measured here, each with a verdict."""
