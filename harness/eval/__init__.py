"""Where perplexity is computed."""
