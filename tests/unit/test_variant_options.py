"""--variants entries with options (the loss on one stage alone, a resync period) parse into
the training configs they name, pair with the right reference, and refuse what they cannot
mean, naming the option."""

from __future__ import annotations

import pytest

from harness.bench.spec import BenchSpec, Variant, base_variant, reference_variant
from harness.train.config import TrainConfig
from testbed.errors import UsageError


@pytest.mark.parametrize("text,name,stage,resync,transport", [
    ("unbiased_drift", "unbiased_drift", "both", 0, "udp"),
    ("unbiased_drift/reduce", "unbiased_drift", "reduce", 0, "udp"),
    ("unbiased_drift/broadcast/resync=5", "unbiased_drift", "broadcast", 5, "udp"),
    ("rps/reduce@roce-uc", "rps", "reduce", 0, "roce-uc"),
    ("unbiased@roce-uc:4096", "unbiased", "both", 0, "roce-uc:4096"),
    ("rps/adamw", "rps", "both", 0, "udp"),
    ("unbiased_drift/reduce/sgd", "unbiased_drift", "reduce", 0, "udp"),
])
def test_a_variant_entry_names_its_options_and_writes_back_the_same(text, name, stage, resync,
                                                                    transport):
    v = Variant.parse(text)
    assert (v.name, v.lossy_stage, v.resync_every, v.transport) == (name, stage, resync,
                                                                     transport)
    assert v.text == text and base_variant(text) == name
    cfg = BenchSpec.make().config(text, seed=3)
    assert (cfg.variant, cfg.lossy_stage, cfg.resync_every, cfg.transport) == (
        name, stage, resync, transport)


@pytest.mark.parametrize("text,says", [
    ("foo/reduce", "unknown variant 'foo'"),
    ("unbiased_drift/x", "'x' is not an option"),
    ("unbiased_drift/reduce/broadcast", "'broadcast' is not an option"),
    ("unbiased_drift/resync=a", "'resync=a' is not an option"),
    ("unbiased_drift/resync=2/resync=3", "'resync=3' is not an option"),
    ("rps/sgd/adamw", "'adamw' is not an option"),
])
def test_a_malformed_entry_is_refused_naming_the_option(text, says):
    with pytest.raises(UsageError, match="--variants") as err:
        Variant.parse(text)
    assert says in str(err.value)


@pytest.mark.parametrize("variants,says", [
    (["reliable/reduce"], "reliable has no lossy stage"),
    (["rps/resync=3"], "resync applies to unbiased_drift only"),
])
def test_a_bench_refuses_options_its_variant_has_not(variants, says):
    with pytest.raises(UsageError, match="--variants") as err:
        BenchSpec.make(variants=variants)
    assert says in str(err.value)


def test_train_refuses_a_lossy_stage_for_reliable_and_an_unknown_stage():
    with pytest.raises(UsageError, match="--lossy-stage"):
        TrainConfig(variant="reliable", lossy_stage="reduce")
    with pytest.raises(UsageError, match="--lossy-stage"):
        TrainConfig(variant="unbiased_drift", lossy_stage="gradients")
    TrainConfig(variant="unbiased_drift", lossy_stage="broadcast")


def test_a_stage_alone_is_paired_with_its_variants_reference_and_named_in_its_runs():
    spec = BenchSpec.make(variants=["reliable", "unbiased_drift/reduce", "rps/broadcast"], seeds=1,
                          realisations=1)
    lossy = {c.variant: c for c in spec.cases() if c.role == "lossy"}
    assert set(lossy) == {"unbiased_drift/reduce", "rps/broadcast"}
    assert lossy["unbiased_drift/reduce"].cfg.lossy_stage == "reduce"
    assert lossy["rps/broadcast"].cfg.lossy_stage == "broadcast"
    # rps (SGD, its paper's) against reliable training under the same SGD, its stage alone
    # too; the others against reliable under the bench's AdamW
    assert reference_variant("rps/broadcast") == "reliable/sgd"
    assert reference_variant("unbiased_drift/reduce") == "reliable"
    # the reference is made when only a stage-alone rps runs, too
    refs = [c.variant for c in spec.cases() if c.role == "reference"]
    assert refs == ["reliable", "reliable/sgd"]


def test_rps_trains_under_sgd_against_reliable_sgd_and_under_adamw_only_when_named():
    spec = BenchSpec.make(variants=["reliable", "unbiased_drift", "rps", "rps/adamw"], seeds=1,
                          realisations=1, regime="scratch")
    cases = spec.cases()
    refs = {c.variant: c.cfg for c in cases if c.role == "reference"}
    lossy = {c.variant: c.cfg for c in cases if c.role == "lossy"}
    assert set(lossy) == {"unbiased_drift", "rps", "rps/adamw"}
    assert (lossy["rps"].optimizer, lossy["rps"].lr) == ("sgd", spec.sgd_peak)
    assert (lossy["unbiased_drift"].optimizer, lossy["unbiased_drift"].lr) == ("adamw", 2e-3)
    assert (lossy["rps/adamw"].optimizer, lossy["rps/adamw"].lr) == ("adamw", 2e-3)
    # reliable under SGD at the same rate is rps's reference (lossless SGD-RPS trains its
    # model: tests/distributed/test_training.py); AdamW-RPS, another algorithm, its own
    # lossless run, waiting for every packet
    assert reference_variant("rps") == "reliable/sgd"
    assert reference_variant("rps/adamw") == "rps/adamw"
    assert set(refs) == {"reliable", "reliable/sgd", "rps/adamw"}
    assert (refs["reliable/sgd"].optimizer, refs["reliable/sgd"].lr) == ("sgd", spec.sgd_peak)
    assert refs["rps/adamw"].wait_for_all and not refs["reliable/sgd"].wait_for_all
    assert "sgd (momentum 0.9) peak" in spec.regime_text and "adamw peak 0.002" in \
        spec.regime_text
    # --optimizer sgd: the other variants train under SGD too, rps stays SGD, one reference
    sgd = BenchSpec.make(variants=["reliable", "unbiased_drift", "rps"], seeds=1, realisations=1,
                         optimizer="sgd", sgd_lr=0.02, regime="scratch")
    assert [c.variant for c in sgd.cases() if c.role == "reference"] == ["reliable/sgd"]
    assert {c.cfg.lr for c in sgd.cases()} == {0.02}
    with pytest.raises(UsageError, match="--sgd-lr"):
        BenchSpec.make(sgd_lr=-1.0)
    # the default question fine-tunes: AdamW at the fine-tune rate, rps's SGD at its own
    default = {c.variant: c.cfg for c in BenchSpec.make(seeds=1).cases() if c.role == "lossy"}
    assert (default["rps"].optimizer, default["rps"].lr) == ("sgd", 0.1)
    assert (default["unbiased_drift"].optimizer, default["unbiased_drift"].lr) == ("adamw",
                                                                                   1e-4)
