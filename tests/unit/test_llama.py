"""The presets' own Llama (harness/model/llama.py) is transformers' LlamaForCausalLM: the
same parameters from the same seed, the same logits and gradients, a folder transformers
reads back; and building a preset does not import transformers (the 3 s of CPU a rank
saves)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from harness.model import presets
from harness.model.llama import LlamaLM, LlamaShape

ROOT = Path(__file__).resolve().parents[2]
VOCAB = 259


def both(name: str, seed: int, **changes):
    fields = {**presets.PRESETS[name], **changes}
    torch.manual_seed(seed)
    theirs = LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, tie_word_embeddings=False,
                                          attn_implementation="eager", **fields))
    torch.manual_seed(seed)
    return theirs, LlamaLM(LlamaShape(vocab_size=VOCAB, **fields))


@pytest.mark.parametrize("name", sorted(presets.PRESETS))
def test_the_same_seed_gives_transformers_parameters_bit_for_bit_in_its_order(name):
    theirs, ours = both(name, seed=11)
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in theirs.named_parameters()]
    for (n, a), (_, b) in zip(theirs.named_parameters(), ours.named_parameters(), strict=True):
        assert torch.equal(a, b), n
    # and the generator is left where transformers leaves it (what is drawn next, the
    # data's order, is the same)
    torch.manual_seed(11)
    LlamaForCausalLM(theirs.config)
    after_theirs = torch.rand(4)
    torch.manual_seed(11)
    LlamaLM(ours.shape)
    assert torch.equal(torch.rand(4), after_theirs)


def test_a_preset_build_is_ours_seeded_like_transformers():
    built = presets.build("tiny", VOCAB, seed=4)
    theirs, _ = both("tiny", seed=4)
    assert isinstance(built, LlamaLM)
    pairs = zip(built.parameters(), theirs.parameters(), strict=True)
    assert all(torch.equal(a, b) for a, b in pairs)


@pytest.mark.parametrize("changes", [{}, {"num_key_value_heads": 2}],
                         ids=["heads", "grouped-kv"])
def test_logits_and_gradients_are_transformers_to_float_rounding(changes):
    theirs, ours = both("tiny", seed=3, **changes)
    inputs = torch.randint(0, VOCAB, (3, 33), generator=torch.Generator().manual_seed(1))
    targets = torch.roll(inputs, -1, dims=1)
    grads = []
    for model in (theirs, ours):
        logits = model(input_ids=inputs).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))
        loss.backward()
        grads.append((logits.detach(), [p.grad for p in model.parameters()]))
    (their_logits, their_grads), (our_logits, our_grads) = grads
    torch.testing.assert_close(our_logits, their_logits, rtol=0, atol=1e-6)
    for a, b in zip(their_grads, our_grads, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-7)


def test_a_saved_preset_is_a_transformers_folder_with_its_weights(tmp_path):
    ours = presets.build("tiny", VOCAB, seed=2)
    presets.save(ours, object(), tmp_path / "model")  # (a tokenizer with nothing to save)
    back = AutoModelForCausalLM.from_pretrained(tmp_path / "model", local_files_only=True)
    assert back.config.model_type == "llama" and back.config.vocab_size == VOCAB
    for (n, a), (_, b) in zip(ours.named_parameters(), back.named_parameters(), strict=True):
        assert torch.equal(a, b), n
    # and --preset FOLDER starts from it
    again = presets.build(str(tmp_path / "model"), VOCAB, seed=9)
    pairs = zip(ours.parameters(), again.parameters(), strict=True)
    assert all(torch.equal(a, b) for a, b in pairs)


def test_building_and_running_a_preset_does_not_import_transformers():
    probe = ("import sys, torch\n"
             "from harness.model import presets\n"
             "m = presets.build('tiny', 259, seed=0)\n"
             "m(input_ids=torch.zeros(1, 8, dtype=torch.long)).logits.sum().backward()\n"
             "print(sorted(n for n in sys.modules if n.split('.')[0] == 'transformers'))\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"


def test_training_steps_follow_transformers_model_to_float_rounding():
    """What the bench reports comes from training: five AdamW steps on the same batches
    give the same losses and weights."""
    theirs, ours = both("tiny", seed=6)
    batches = torch.randint(0, VOCAB, (5, 4, 17), generator=torch.Generator().manual_seed(2))
    losses = []
    for model in (theirs, ours):
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95))
        seen = []
        for batch in batches:
            logits = model(input_ids=batch[:, :-1]).logits
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB),
                                                     batch[:, 1:].reshape(-1))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            seen.append(loss.item())
        losses.append(seen)
    assert losses[1] == pytest.approx(losses[0], rel=1e-6, abs=0)
    for a, b in zip(theirs.parameters(), ours.parameters(), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
