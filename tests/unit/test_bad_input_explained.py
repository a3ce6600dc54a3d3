"""Bad input explained (#46): a profile file's loss given as a number or as "10%", a YAML
syntax error at its line and column, an inventory whose hosts disagree on the MTU named
host by host, a profile this kernel cannot apply refused before a bench builds its cluster."""

from __future__ import annotations

import pytest

from testbed import profiles
from testbed.errors import UsageError
from testbed.impair import engine


def load_text(tmp_path, text: str):
    path = tmp_path / "mine.yaml"
    path.write_text(text)
    with pytest.raises(profiles.ProfileError) as err:
        profiles.load(str(path))
    return str(err.value)


def test_a_loss_given_as_a_number_says_how_to_write_a_loss_model(tmp_path):
    said = load_text(tmp_path, "impairment:\n  loss: 0.1\n")
    assert "impairment.loss: a loss model, not a number (got 0.1)" in said
    assert "{model: bernoulli, loss_pct: 10}" in said and "--loss 0.1" in said


def test_a_percent_sign_in_a_file_gets_the_hint_the_command_line_gets(tmp_path):
    said = load_text(tmp_path, "impairment:\n  loss:\n    model: bernoulli\n"
                               "    loss_pct: 10%\n")
    assert "impairment.loss.loss_pct: expected a number, got '10%'" in said
    assert "Write 10: the field is already a percent" in said


def test_a_yaml_syntax_error_names_the_line_and_column_and_shows_the_line(tmp_path):
    said = load_text(tmp_path, "impairment:\n  loss: {model: bernoulli\n  delay_ms: 3\n")
    assert "mine.yaml" in said and "line 3, column 11" in said
    lines = said.splitlines()
    shown = next(i for i, line in enumerate(lines) if line.strip() == "delay_ms: 3")
    assert lines[shown + 1].strip() == "^"


def test_hosts_that_disagree_on_the_mtu_are_named(tmp_path):
    from testbed.clusters import remote

    inventory = tmp_path / "hosts.yml"
    inventory.write_text(
        "all:\n  hosts:\n"
        "    gpu1: {ansible_host: 192.0.2.1, lossbed_interface: eth1, "
        "lossbed_address: 10.0.0.1, lossbed_mtu: 9000}\n"
        "    gpu2: {ansible_host: 192.0.2.2, lossbed_interface: eth1, "
        "lossbed_address: 10.0.0.2, lossbed_mtu: 1500}\n"
        "    gpu3: {ansible_host: 192.0.2.3, lossbed_interface: eth1, "
        "lossbed_address: 10.0.0.3, lossbed_mtu: 9000}\n")
    with pytest.raises(UsageError) as err:
        remote.from_inventory(str(inventory))
    assert "1500: gpu2; 9000: gpu1, gpu3" in str(err.value)


def test_a_profile_only_netem_applies_is_refused_before_a_cluster_without_it(monkeypatch):
    monkeypatch.setattr(engine, "netem_on_this_kernel", lambda: "no sch_netem here")
    with pytest.raises(UsageError) as err:
        engine.refuse_for_this_kernel(profiles.load("wan", loss=0.1), 4)
    assert "wan" in str(err.value) and "--kind vm" in str(err.value)
    engine.refuse_for_this_kernel(profiles.load("random-loss", loss=0.1), 4)  # bpf or nft
    monkeypatch.setattr(engine, "netem_on_this_kernel", lambda: None)
    engine.refuse_for_this_kernel(profiles.load("wan", loss=0.1), 4)  # netem will say
