"""transformers' Llama architecture in sizes that train on CPUs, or any local HF model.

The presets are built by llama.py (the same network, without importing transformers);
a folder goes through transformers.

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

    check(name)
    torch.manual_seed(seed)
    if name in PRESETS:
        from harness.model.llama import LlamaLM, LlamaShape

        return LlamaLM(LlamaShape(vocab_size=vocab_size, **PRESETS[name]))
    from transformers import AutoConfig, AutoModelForCausalLM

    path = Path(name)
    if any(path.glob("*.safetensors")) or any(path.glob("*.bin")):
        model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True)
    else:
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(
            path, local_files_only=True))
    if model.config.vocab_size != vocab_size:
        raise UsageError("--preset", f"the model in {path} has {model.config.vocab_size} "
                         f"tokens, the tokenizer {vocab_size}", "Use the tokenizer it was "
                         "trained with (--tokenizer: the same spec, or the folder itself)")
    return model


# The chaos check's noise is drawn from its own generator, seeded apart from the model's
NOISE_SEED_OFFSET = 7919


def perturb(model, sd: float, seed: int) -> None:
    """Add N(0, sd²) to every weight, in place: the twin of a run whose initial weights
    differ by `sd` (the chaos check's twin: harness/bench/stability.py)."""
    import torch

    gen = torch.Generator().manual_seed(seed + NOISE_SEED_OFFSET)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(sd * torch.randn(p.shape, generator=gen, dtype=p.dtype))


def save(model, tok, folder: Path) -> None:
    """The model as HF writes it (config.json, model.safetensors), with its tokenizer where
    it has one HF can read back (a trained BPE or an HF tokenizer; bytes need none), so that
    --preset FOLDER (and --tokenizer FOLDER) start from it."""
    from harness.model.llama import LlamaLM

    folder.mkdir(parents=True, exist_ok=True)
    if isinstance(model, LlamaLM):  # a preset's: saved as transformers' model
        model = model.to_transformers()
    model.save_pretrained(folder, safe_serialization=True)
    inner = getattr(tok, "inner", None)
    if inner is None:
        return
    if hasattr(inner, "save_pretrained"):  # an HF tokenizer
        inner.save_pretrained(folder)
    else:  # a `tokenizers` BPE: wrapped as HF's fast tokenizer
        from transformers import PreTrainedTokenizerFast

        PreTrainedTokenizerFast(tokenizer_object=inner).save_pretrained(folder)
