"""Hostile profile files get a clear error, never a traceback: exit 2, a message that names
the file and what is wrong with it (the field, where there is one). The corpus is in
tests/data/hostile_profiles/; a 20 MB scalar and every numeric field at ±inf, NaN, 1e30 and
-1 are made here. That the hosts' kernel state stays unchanged is checked on a real cluster
by tests/netns/test_hostile_profiles.py. No root needed: the profile is refused before any
cluster is looked up."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from testbed import cli, profiles
from testbed.errors import UsageError
from testbed.profiles import model

CORPUS = Path(__file__).resolve().parents[1] / "data" / "hostile_profiles"

# file -> what the message must say (besides the file's name)
EXPECTED = {
    "non_utf8.yaml": "not UTF-8",
    "nul_bytes.yaml": "NUL byte",
    "binary.yaml": "NUL byte",
    "deep_nesting.yaml": "nested",
    "deep_mappings.yaml": "nested",
    "alias_bomb.yaml": "aliases",
    "self_reference.yaml": "alias of itself",
    "duplicate_key.yaml": "'delay_ms' is given twice",
    "python_tag.yaml": "not valid YAML",
    "not_a_mapping.yaml": "must be a mapping",
    "path_as_name.yaml": "name:",
    "delay_5000_s.yaml": "impairment.delay_ms: Input should be less than or equal to "
                         "274877.90688 (got 5000000): netem holds a delay as a 32-bit count "
                         "of 64 ns ticks",
    "loss_below_resolution.yaml": "impairment.loss.loss_pct: 1e-12 % is below the finest",
    "rate_below_one_byte.yaml": "impairment.rate_mbit",
}


def refused(path: Path, capsys) -> str:
    """Run `lossbed apply FILE --dry-run` in-process: an escaping exception fails the test
    (that is the traceback a user would see); otherwise the exit code must be 2."""
    rc = cli.main(["apply", str(path), "--cluster", "nosuch", "--dry-run"])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "Traceback" not in err
    assert str(path) in err, err  # the message names the file
    return err


def test_the_corpus_is_complete():
    assert sorted(p.name for p in CORPUS.glob("*.yaml")) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_hostile_file_is_refused_with_what_is_wrong(name, capsys):
    err = refused(CORPUS / name, capsys)
    assert EXPECTED[name] in err, err


def test_a_20_mb_scalar_is_refused_before_it_is_parsed(tmp_path, capsys):
    path = tmp_path / "huge.yaml"
    with open(path, "w") as f:
        f.write("name: huge\ndescription: ")
        f.write("x" * (20 << 20))
    err = refused(path, capsys)
    assert "lossbed reads at most 1,048,576 bytes" in err


# Every numeric field, inside a profile where it is otherwise valid: (context, where, key)
def _numeric_fields():
    contexts = [
        ({}, "impairment", {"delay_ms": 10, "jitter_ms": 1, "reorder_pct": 5,
                            "duplicate_pct": 1, "corrupt_pct": 1}),
        ({"model": "bernoulli", "loss_pct": 5}, "impairment.loss", {}),
        ({"model": "gilbert_elliott", "p_pct": 1, "r_pct": 20}, "impairment.loss", {}),
        ({"model": "gilbert_elliott", "loss_pct": 5, "mean_burst_packets": 4},
         "impairment.loss", {}),
        ({"model": "four_state", "p13_pct": 1}, "impairment.loss", {}),
        ({"min_delay_ms": 1, "max_delay_ms": 2}, "impairment.slot", {}),
        ({"distribution": "normal", "delay_ms": 1, "jitter_ms": 0.5}, "impairment.slot", {}),
    ]
    impairment_numbers = ["delay_ms", "jitter_ms", "delay_correlation_pct", "rate_mbit",
                          "reorder_pct", "reorder_correlation_pct", "reorder_gap_packets",
                          "duplicate_pct", "duplicate_correlation_pct", "corrupt_pct",
                          "corrupt_correlation_pct", "seed", "limit_packets"]
    for key in impairment_numbers:
        yield contexts[0][2], "impairment", key
    numbers = {
        "bernoulli": ["loss_pct", "correlation_pct"],
        "gilbert_elliott": ["p_pct", "r_pct", "loss_in_bad_pct", "loss_in_good_pct",
                            "max_burst_ms"],
        "four_state": ["p13_pct", "p31_pct", "p32_pct", "p23_pct", "p14_pct"],
    }
    for base, where, _ in contexts[1:5]:
        kind = base["model"]
        keys = numbers[kind] if "loss_pct" not in base or kind == "bernoulli" else [
            "loss_pct", "mean_burst_packets"]
        for key in keys:
            yield base, where, key
    for key in ("min_delay_ms", "max_delay_ms", "max_packets", "max_bytes"):
        yield contexts[5][0], "impairment.slot", key
    for key in ("delay_ms", "jitter_ms"):
        yield contexts[6][0], "impairment.slot", key


NUMERIC = list(_numeric_fields())


def test_the_numeric_field_list_covers_the_model():
    covered = {key for _, _, key in NUMERIC}
    for cls in (model.Impairment, model.Bernoulli, model.GilbertElliott, model.FourState,
                model.Slot):
        for name, field in cls.model_fields.items():
            if field.annotation in (bool,) or name in ("model", "loss", "slot",
                                                       "delay_distribution", "distribution",
                                                       "ecn"):
                continue
            assert name in covered, f"{cls.__name__}.{name} is not tested at hostile values"


@pytest.mark.parametrize("value", [".inf", "-.inf", ".nan", "1e30", "-1"])
def test_every_numeric_field_refuses_infinite_huge_and_negative_values(value, tmp_path,
                                                                       capsys):
    for base, where, key in NUMERIC:
        doc = {"name": "hostile", "impairment": {}}
        target = doc["impairment"]
        if where == "impairment":
            target.update(base)
        else:
            target[where.split(".")[-1]] = dict(base)
            target = target[where.split(".")[-1]]
        if where == "impairment.loss":
            doc["impairment"]["delay_ms"] = 1
        target[key] = "__VALUE__"
        text = yaml.safe_dump(doc).replace("__VALUE__", value)
        path = tmp_path / f"{key}.yaml"
        path.write_text(text)
        err = refused(path, capsys)
        assert f"{where}.{key}" in err, (key, value, err)


def test_set_overrides_get_the_same_checks():
    with pytest.raises(UsageError, match="delay_ms"):
        profiles.load("clean", ["delay_ms=.inf"])
    with pytest.raises(UsageError, match="alias of itself"):
        profiles.load("clean", ["description=&a [*a]"])
    with pytest.raises(UsageError, match="characters long"):
        profiles.load("clean", ["description=" + "x" * 20000])


def test_values_at_the_kernel_limits_are_accepted():
    imp = profiles.load("clean", ["delay_ms=274877.9", "jitter_ms=1", "rate_mbit=0.000008",
                                  "limit_packets=4294967295"]).impairment
    assert imp.delay_ms == 274877.9 and imp.limit_packets == 2**32 - 1
