"""transformers' Llama architecture in sizes that train on CPUs, or any local HF model.

    tiny    ~0.46 M parameters: trains to a plateau in minutes on 2 CPU cores
    small   ~7 M parameters
    PATH    a local folder with an HF config.json (and weights, if any): real clusters
"""

from __future__ import annotations

from pathlib import Path

from testbed.errors import UsageError

PRESETS = {
    "tiny": dict(hidden_size=128, intermediate_size=344, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=512),
    "small": dict(hidden_size=384, intermediate_size=1024, num_hidden_layers=4,
                  num_attention_heads=6, num_key_value_heads=6, max_position_embeddings=1024),
}


def check(name: str) -> None:
    """Refuse an unknown preset or a model folder without a config, before anything starts."""
    if name in PRESETS:
        return
    path = Path(name)
    if path.is_dir() and (path / "config.json").is_file():
        return
    raise UsageError("--preset", f"{name!r} is neither a preset nor a folder with an HF "
                     "config.json", f"Use one of: {', '.join(PRESETS)}, or a local model path")


def build(name: str, vocab_size: int, seed: int):
    """A causal LM, initialised from `seed` (the same weights on every rank)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    check(name)
    torch.manual_seed(seed)
    if name in PRESETS:
        config = LlamaConfig(vocab_size=vocab_size, tie_word_embeddings=False,
                             attn_implementation="eager", **PRESETS[name])
        return LlamaForCausalLM(config)
    path = Path(name)
    if any(path.glob("*.safetensors")) or any(path.glob("*.bin")):
        return AutoModelForCausalLM.from_pretrained(path, local_files_only=True)
    return AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path,
                                                                       local_files_only=True))
