"""A trained model written by --save-model comes back through --preset DIR (and its
tokenizer through --tokenizer DIR) as it was: same weights, same tokens, same bytes per
token; a model whose vocabulary is not the tokenizer's is refused; the chaos check's twin
differs from its run by the noise asked for, and only by it."""

from __future__ import annotations

import pytest
import torch

from harness.data.corpus import load_documents, prepare
from harness.eval.models import flat
from harness.model import presets
from harness.model import tokenizer as tokenizers
from testbed.errors import UsageError


@pytest.fixture(scope="module")
def bpe():
    documents, source = load_documents(None, None)
    tok, corpus = prepare(documents, source, "bpe", 64)
    return tok, corpus


def test_a_saved_model_and_its_tokenizer_load_back_unchanged(bpe, tmp_path):
    tok, corpus = bpe
    model = presets.build("tiny", tok.vocab_size, seed=3)
    presets.save(model, tok, tmp_path / "ckpt")
    back = presets.build(str(tmp_path / "ckpt"), tok.vocab_size, seed=99)  # seed: no effect
    assert torch.equal(flat(back), flat(model))
    again = tokenizers.load(str(tmp_path / "ckpt"), "")
    text = "def f(x):\n    return x ** 2  # é, ü and 🙂\n"
    assert again.encode(text) == tok.encode(text)
    assert again.vocab_size == tok.vocab_size
    assert (again.token_bytes == tok.token_bytes).all()  # bits per byte unchanged


def test_a_model_of_another_vocabulary_is_refused_naming_the_fix(bpe, tmp_path):
    tok, _ = bpe
    presets.save(presets.build("tiny", 256, seed=0), tokenizers.ByteTokenizer(),
                 tmp_path / "bytes")
    with pytest.raises(UsageError, match="--preset") as err:
        presets.build(str(tmp_path / "bytes"), tok.vocab_size, seed=0)
    assert "256 tokens" in str(err.value) and "--tokenizer" in str(err.value)


def test_the_twin_differs_by_the_noise_asked_for_and_is_replayable():
    a = presets.build("tiny", 300, seed=1)
    b = presets.build("tiny", 300, seed=1)
    presets.perturb(b, 1e-6, seed=1)
    diff = flat(b) - flat(a)
    assert 0.9e-6 < float(diff.std()) < 1.1e-6
    c = presets.build("tiny", 300, seed=1)
    presets.perturb(c, 1e-6, seed=1)
    assert torch.equal(flat(b), flat(c))
