"""--variants entries with options (the loss on one stage alone, a resync period) parse into
the training configs they name, pair with the right reference, and refuse what they cannot
mean, naming the option."""

from __future__ import annotations

import pytest

from harness.bench.spec import BenchSpec, Variant, base_variant
from harness.bench.summary import reference_variant
from harness.train.config import TrainConfig
from testbed.errors import UsageError


@pytest.mark.parametrize("text,name,stage,resync,transport", [
    ("unbiased_drift", "unbiased_drift", "both", 0, "udp"),
    ("unbiased_drift/reduce", "unbiased_drift", "reduce", 0, "udp"),
    ("unbiased_drift/broadcast/resync=5", "unbiased_drift", "broadcast", 5, "udp"),
    ("rps/reduce@roce-uc", "rps", "reduce", 0, "roce-uc"),
    ("unbiased@roce-uc:4096", "unbiased", "both", 0, "roce-uc:4096"),
])
def test_a_variant_entry_names_its_options_and_writes_back_the_same(text, name, stage, resync,
                                                                    transport):
    v = Variant.parse(text)
    assert (v.name, v.lossy_stage, v.resync_every, v.transport) == (name, stage, resync,
                                                                     transport)
    assert v.text == text and base_variant(text) == name
    cfg = BenchSpec().config(text, seed=3)
    assert (cfg.variant, cfg.lossy_stage, cfg.resync_every, cfg.transport) == (
        name, stage, resync, transport)


@pytest.mark.parametrize("text,says", [
    ("foo/reduce", "unknown variant 'foo'"),
    ("unbiased_drift/x", "'x' is not an option"),
    ("unbiased_drift/reduce/broadcast", "'broadcast' is not an option"),
    ("unbiased_drift/resync=a", "'resync=a' is not an option"),
    ("unbiased_drift/resync=2/resync=3", "'resync=3' is not an option"),
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
        BenchSpec(variants=variants).validate()
    assert says in str(err.value)


def test_train_refuses_a_lossy_stage_for_reliable_and_an_unknown_stage():
    with pytest.raises(UsageError, match="--lossy-stage"):
        TrainConfig(variant="reliable", lossy_stage="reduce").validate()
    with pytest.raises(UsageError, match="--lossy-stage"):
        TrainConfig(variant="unbiased_drift", lossy_stage="gradients").validate()
    TrainConfig(variant="unbiased_drift", lossy_stage="broadcast").validate()


def test_a_stage_alone_is_paired_with_its_variants_reference_and_named_in_its_runs():
    spec = BenchSpec(variants=["reliable", "unbiased_drift/reduce", "rps/broadcast"], seeds=1,
                     realisations=1)
    lossy = {c.variant: c for c in spec.cases() if c.role == "lossy"}
    assert set(lossy) == {"unbiased_drift/reduce", "rps/broadcast"}
    assert lossy["unbiased_drift/reduce"].cfg.lossy_stage == "reduce"
    assert lossy["rps/broadcast"].cfg.lossy_stage == "broadcast"
    # rps's stage alone against rps's own lossless run, as rps itself is
    assert reference_variant("rps/broadcast") == "rps"
    assert reference_variant("unbiased_drift/reduce") == "reliable"
    # the rps reference is made when only a stage-alone rps runs, too
    refs = [c.variant for c in spec.cases() if c.role == "reference"]
    assert refs == ["reliable", "rps"]
