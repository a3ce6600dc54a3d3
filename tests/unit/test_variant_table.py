"""The variant table (harness/variants.py, #68 item 2): one declaration per variant, read
by the worker, the many-rank mode, the scoring and the bench's references."""

from __future__ import annotations

import pytest

from harness import variants
from harness.bench.spec import Variant, reference_variant
from harness.eval import models
from harness.names import VARIANTS
from harness.train import worker
from harness.train.config import ESTIMATOR_OF


def test_every_variant_is_declared_once_with_each_of_its_facts():
    assert tuple(variants.TABLE) == VARIANTS
    assert {name: (k.wrapper, k.estimator, k.own_optimizer, k.optimizer_fixed, k.headline,
                   k.self_reference_off_own_optimizer) for name, k in variants.TABLE.items()} == {
        "reliable": ("reliable", None, "adamw", False, "rank0", False),
        "zero_fill": ("gradient_hook", "zero_fill", "adamw", False, "rank_mean", False),
        "unbiased": ("gradient_hook", "received_mean", "adamw", False, "rank_mean", False),
        "unbiased_drift": ("sharded_optimizer", "received_mean", "adamw", False, "owners",
                           False),
        "rps": ("rps_optimizer", None, "sgd", True, "rank_mean", True)}
    with pytest.raises(ValueError, match="unknown variant 'nope'"):
        variants.of("nope")


def test_its_readers_take_what_it_declares():
    assert set(worker.WRAPPERS) == {k.wrapper for k in variants.TABLE.values()}
    assert models.HEADLINE == {n: k.headline for n, k in variants.TABLE.items()}
    assert ESTIMATOR_OF == {"zero_fill": "zero_fill", "unbiased": "received_mean",
                            "unbiased_drift": "received_mean", "rescale": "rescale"}
    assert [n for n, k in variants.TABLE.items() if k.replicas_differ] == [
        "zero_fill", "unbiased", "unbiased_drift", "rps"]
    assert [n for n, k in variants.TABLE.items() if k.bounded_by_owners] == ["unbiased_drift"]


@pytest.mark.parametrize("variant, optimizer, reference", [
    ("unbiased", "adamw", "reliable"), ("unbiased_drift", "sgd", "reliable/sgd"),
    ("rps", "adamw", "reliable/sgd"),          # rps keeps its own SGD whatever the bench's
    ("rps/adamw", "adamw", "rps/adamw"),       # under another optimizer: itself
    ("reliable", "adamw", "reliable")])
def test_each_variants_reference_follows_from_the_table(variant, optimizer, reference):
    assert reference_variant(Variant.parse(variant).resolved(optimizer).text) == reference
