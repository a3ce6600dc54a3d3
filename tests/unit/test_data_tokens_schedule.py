"""The data a run trains and is scored on: the batches (torch's DistributedSampler), the
held-out split (by hash, none of its windows in training), the subword tokenizer (trained
on the training split only), and the learning-rate schedule."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from harness.data.corpus import Corpus, Split, load_documents, prepare, window_hashes
from harness.data.sampler import Batches
from harness.model import tokenizer as tokenizers
from harness.train import schedule
from testbed.errors import UsageError


def test_every_rank_draws_from_the_whole_split_and_no_step_repeats_a_sample():
    tokens = torch.arange(16 * 160 + 1)  # 160 samples of 16 + 1 tokens
    world, batch = 4, 5
    ranks = [Batches(tokens, r, world, batch, 16, seed=3) for r in range(world)]
    per_epoch = ranks[0].per_rank // batch  # 8 steps
    seen = [set() for _ in range(world)]
    for _ in range(per_epoch):
        step = [b.next_indices().tolist() for b in ranks]
        flat = [i for chosen in step for i in chosen]
        assert len(flat) == len(set(flat)) == world * batch  # no overlap within a step
        for r, chosen in enumerate(step):
            seen[r] |= set(chosen)
    # over an epoch the ranks together take every sample once, and each rank's samples
    # come from the whole split, not from a region of it
    assert set().union(*seen) == set(range(160)) and sum(map(len, seen)) == 160
    for mine in seen:
        assert min(mine) < 20 and max(mine) > 140
    # windows: consecutive tokens, targets the inputs shifted by one
    x, y = Batches(tokens, 1, world, batch, 16, seed=3).next()
    assert torch.equal(x[:, 1:], y[:, :-1]) and torch.equal(y - x, torch.ones_like(x))


def test_the_order_depends_on_the_seed_alone():
    tokens = torch.arange(2000)
    a = Batches(tokens, 2, 4, 4, 16, seed=7)
    b = Batches(tokens, 2, 4, 4, 16, seed=7)
    c = Batches(tokens, 2, 4, 4, 16, seed=8)
    d = Batches(tokens, 1, 4, 4, 16, seed=7)
    first = [a.next_indices().tolist() for _ in range(10)]
    assert first == [b.next_indices().tolist() for _ in range(10)]
    assert first != [c.next_indices().tolist() for _ in range(10)]
    assert first != [d.next_indices().tolist() for _ in range(10)]


def test_no_two_seeds_share_an_epochs_order():
    # DistributedSampler seeds epoch e of seed s with s + e: without the stride, seed 7's
    # second epoch is seed 8's first (mutation caught: SEED_STRIDE = 1)
    tokens = torch.arange(16 * 40 + 1)  # 40 samples: 10 per rank, 2 batches of 5 per epoch
    seven, eight = Batches(tokens, 0, 4, 5, 16, seed=7), Batches(tokens, 0, 4, 5, 16, seed=8)
    second_epoch_of_7 = [seven.next_indices().tolist() for _ in range(4)][2:]
    first_epoch_of_8 = [eight.next_indices().tolist() for _ in range(2)]
    assert second_epoch_of_7 != first_epoch_of_8


def test_too_few_samples_for_a_batch_is_refused():
    with pytest.raises(UsageError, match="--batch"):
        Batches(torch.arange(100), 0, 4, 8, 16, seed=0)


def test_the_held_out_split_is_chosen_by_hash_not_position():
    documents, _ = load_documents()
    split = Split.of(documents)
    fraction = len(split.heldout_text) / (len(split.train_text) + len(split.heldout_text))
    assert 0.05 < fraction < 0.2
    held = set(split.heldout_text.split("\n\n"))
    positions = [i for i, d in enumerate(documents) if d in held]
    # spread over the corpus (the alphabetical tail was the old split)
    assert positions[0] < len(documents) * 0.2 and positions[-1] > len(documents) * 0.8
    assert Split.of(documents).split_sha == split.split_sha  # deterministic
    other = Split.of(documents[:-1])
    assert other.corpus_sha != split.corpus_sha


def test_no_held_out_window_occurs_verbatim_in_training():
    # a paragraph repeated in many documents: held-out windows inside it are in training too
    repeated = "This paragraph is boilerplate that many pages of a manual repeat word for word."
    documents = [f"Document {i} says {i * 7919 % 1000} things. {repeated} The end of {i}."
                 for i in range(300)]
    corpus = Corpus.build(Split.of(documents), tokenizers.ByteTokenizer(), "test", 16)
    assert corpus.heldout_dropped > 0
    train = corpus.train.numpy()
    text_of_train = bytes(train.astype(np.uint8))
    for window in corpus.heldout.numpy():
        assert bytes(window.astype(np.uint8)) not in text_of_train
    # the hashes agree with a direct comparison of windows
    hashes = window_hashes(np.array([1, 2, 3, 1, 2, 3, 4]), 3)
    assert hashes[0] == hashes[3] and len(set(hashes.tolist())) == 4


def test_the_bpe_round_trips_and_its_bytes_add_up():
    documents, source = load_documents()
    tok, corpus = prepare(documents, source, "bpe:512", 32)
    text = "def f(x):\n    return x ** 2  # squares, über alles\n"
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert int(tok.token_bytes[ids].sum()) == len(text.encode())
    assert tok.vocab_size == 512 and tok.name.startswith("bpe512-")
    assert len(ids) < 0.8 * len(text.encode())  # it merges: fewer tokens than bytes


def test_the_bpe_is_trained_on_the_training_split_only(tmp_path, monkeypatch):
    monkeypatch.setattr(tokenizers, "CACHE", tmp_path)
    # every document has a marker word of its own, repeated so that a BPE trained on it
    # would learn it whole
    markers = [f"q{chr(97 + i % 26)}{chr(97 + i // 26 % 26)}xz" for i in range(120)]
    documents = [" ".join([m] * 40) + f" and plain words {i}." for i, m in enumerate(markers)]
    split = Split.of(documents)
    tok = tokenizers.load("bpe:600", split.train_text)
    vocab = {t.replace("Ġ", " ").strip() for t in tok.inner.get_vocab()}
    held = [m for m, d in zip(markers, documents, strict=True) if d in split.heldout_text]
    trained = [m for m in markers if m not in held]
    assert held and trained
    assert not any(m in vocab for m in held)        # never seen: not a token
    assert sum(m in vocab for m in trained) > len(trained) / 2  # seen: learnt
    # cached, and the same on a second load
    assert list(tmp_path.glob("bpe600-*.json"))
    again = tokenizers.load("bpe:600", split.train_text)
    assert again.inner.to_str() == tok.inner.to_str()


def test_a_cache_it_cannot_write_to_costs_a_second_training_not_the_run(tmp_path,
                                                                         monkeypatch):
    """A Slurm job's user may not write to the checkout's cache (root's): the tokenizers
    library says so with an Exception of its own, not an OSError."""
    import os

    monkeypatch.setattr(tokenizers, "CACHE", tmp_path)
    text = " ".join(f"word{i % 50} and more" for i in range(400))
    key = tokenizers.hashlib.sha256(text.encode()).hexdigest()[:16]
    (tmp_path / f"bpe300-{key}.{os.getpid()}.tmp").mkdir()  # where it writes: not a file
    tok = tokenizers.load("bpe:300", text)
    assert tok.encode("word1 and more") and not list(tmp_path.glob("bpe300-*.json"))


def test_tokenizer_specs_are_checked():
    for bad in ("bpe:100", "bpe:x", "/nonexistent/tokenizer"):
        with pytest.raises(UsageError, match="--tokenizer"):
            tokenizers.check(bad)
    for good in ("bpe", "bpe:4096", "bytes", None):
        tokenizers.check(good)


def test_the_schedule_warms_up_then_decays_to_a_tenth():
    lrs = [schedule.lr_at(s, 100, 1e-3) for s in range(100)]
    assert lrs[0] == pytest.approx(1e-3 / 5) and lrs[4] == pytest.approx(1e-3)  # 5% warm-up
    assert all(a <= b for a, b in zip(lrs[:5], lrs[1:5], strict=False))
    assert all(a >= b for a, b in zip(lrs[5:], lrs[6:], strict=False))
    assert lrs[-1] == pytest.approx(1e-4, rel=0.01)
    assert schedule.lr_at(50, 100, 1e-3, "constant") == 1e-3
    assert schedule.lr_at(0, 100, 1e-3, warmup=0) == pytest.approx(1e-3)
    mid = schedule.lr_at(52, 100, 1e-3)  # half way through the decay: (1 + 0.1) / 2
    assert mid == pytest.approx(1e-3 * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 47 / 95))))


def test_set_lr_reaches_the_optimizer_inside_a_wrapper():
    """lossbed's wrappers are torch optimizers: the rate set on theirs is the user's."""
    from harness.ddp.rps import RPSOptimizer

    model = torch.nn.Linear(2, 1)
    inner = torch.optim.SGD(model.parameters(), lr=1.0)
    wrapper = RPSOptimizer(model, inner, rps=None)  # (the averaging is not reached)
    schedule.set_lr(wrapper, 0.25)
    assert inner.param_groups[0]["lr"] == 0.25
