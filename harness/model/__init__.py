"""The model under training: transformers' Llama in small presets, and tokenizers."""
