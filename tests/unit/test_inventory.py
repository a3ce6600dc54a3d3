"""Inventories of real hosts: what is read, and the bad ones refused with the fix."""

from __future__ import annotations

import pytest

from testbed.clusters import inventory, remote
from testbed.errors import UsageError

GOOD = """
all:
  vars:
    ansible_user: root
    lossbed_mtu: 9000
  hosts:
    gpu1:
      ansible_host: 10.0.0.1
      lossbed_interface: ens6
      lossbed_address: 192.168.50.1
      lossbed_gpus: 2
  children:
    rack2:
      vars:
        ansible_port: 2222
      hosts:
        gpu2:
          ansible_host: 10.0.0.2
          lossbed_interface: ens6
          lossbed_address: 192.168.50.2
"""


def write(tmp_path, text):
    path = tmp_path / "inv.yml"
    path.write_text(text)
    return path


def test_a_good_inventory_with_groups_and_inherited_vars(tmp_path):
    hosts = inventory.load(write(tmp_path, GOOD))
    assert set(hosts) == {"gpu1", "gpu2"}
    assert hosts["gpu2"].ansible_port == 2222 and hosts["gpu1"].ansible_port == 22
    assert hosts["gpu1"].lossbed_mtu == 9000 and hosts["gpu1"].lossbed_gpus == 2
    cluster = remote.from_inventory(str(write(tmp_path, GOOD)))
    assert cluster.mtu == 9000 and [h.ifname for h in cluster.hosts] == ["ens6", "ens6"]
    assert cluster.hosts[0].python == "/opt/lossbed/.venv/bin/python"


@pytest.mark.parametrize("text,words", [
    (GOOD.replace("      lossbed_interface: ens6\n      lossbed_address: 192.168.50.1\n",
                  "      lossbed_address: 192.168.50.1\n"),
     ["host gpu1", "lossbed_interface is missing", "data-plane NIC"]),
    (GOOD.replace("lossbed_gpus: 2", "lossbed_gpu: 2"),
     ["unknown key 'lossbed_gpu'", "did you mean lossbed_gpus"]),
    (GOOD.replace("    gpu1:\n", "    gpu1:\n      colour: blue\n"), ["unknown key 'colour'"]),
    (GOOD.replace("  children:", "    gpu1:\n      ansible_host: 10.0.0.9\n  children:"),
     ["'gpu1' is given twice"]),
    (GOOD.replace("10.0.0.2", "10.0.0.1").replace("ansible_port: 2222", "ansible_port: 22"),
     ["share", "Each host needs its own address"]),
    ("hosts: {}\n", ["lists no hosts"]),
    ("all:\n  hosts: {}\n", ["lists no hosts"]),
    # the ranks' address is parsed as one (issue #46: 192.168.50.300 was accepted)
    (GOOD.replace("192.168.50.1", "192.168.50.300"),
     ["host gpu1", "lossbed_address", "'192.168.50.300' is not an IP address",
      "the data-plane NIC's address, e.g. 192.168.50.1"]),
    (GOOD.replace("192.168.50.1", "192.168.50.0/24"), ["lossbed_address", "not an IP address"]),
    (GOOD.replace("192.168.50.1", "gpu1-data"), ["lossbed_address", "not an IP address"]),
])
def test_bad_inventories_name_the_problem(tmp_path, text, words):
    with pytest.raises(UsageError) as err:
        inventory.load(write(tmp_path, text))
    for word in words:
        assert word in str(err.value), (word, str(err.value))


ANSIBLE_STYLE = """
all:
  vars:
    ansible_user: root
    lossbed_mtu: 1000
    lossbed_project: /from/the/file
    lossbed_kernel_udp_buffer_bytes: 1048576   # a role's variable: Ansible's business
  hosts:
    gpu[1:3]:
      lossbed_interface: ens6
  children:
    gpus:
      vars: {lossbed_mtu: 2000, lossbed_gpus: 1}
      hosts:
        gpu[2:3]:
    zeta:
      vars: {lossbed_gpus: 5}
      hosts:
        gpu3:
    racks:
      children:
        rack1:
          vars: {ansible_port: 2201}
          hosts:
            gpu1:
"""


def test_an_ipv6_data_plane_address_is_one(tmp_path):
    hosts = inventory.load(write(tmp_path, GOOD.replace("192.168.50.1", "fd00:50::1")))
    assert hosts["gpu1"].lossbed_address == "fd00:50::1"


def test_the_inventory_is_read_as_ansible_inventory_reads_it(tmp_path):
    """Ranges, a host in several groups, nested groups, group_vars/ (a file and a folder)
    and host_vars/, against ansible-inventory --list: the reference parser of the file
    `make provision` reads."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    (tmp_path / "inv.yml").write_text(ANSIBLE_STYLE)
    (tmp_path / "group_vars" / "gpus").mkdir(parents=True)
    (tmp_path / "group_vars" / "all.yml").write_text(
        "lossbed_project: /from/group_vars\nlossbed_mtu: 3000\nlossbed_rdma_enabled: false\n")
    (tmp_path / "group_vars" / "gpus" / "10-gpus.yml").write_text("lossbed_gpus: 7\n")
    (tmp_path / "group_vars" / "gpus" / "20-more.yaml").write_text("lossbed_gpus: 8\n")
    (tmp_path / "host_vars").mkdir()
    for i in (1, 2, 3):
        (tmp_path / "host_vars" / f"gpu{i}.yml").write_text(
            f"ansible_host: 10.0.0.{i}\nlossbed_address: 192.168.50.{i}\n"
            + ("lossbed_mtu: 9000\n" if i == 3 else ""))
    ansible = Path(sys.executable).parent / "ansible-inventory"
    from tests.helpers import ansible_env

    listed = subprocess.run([str(ansible), "-i", str(tmp_path / "inv.yml"), "--list"],
                            capture_output=True, text=True, timeout=120, check=True,
                            env=ansible_env(tmp_path), stdin=subprocess.DEVNULL)
    reference = json.loads(listed.stdout)["_meta"]["hostvars"]
    hosts = inventory.load(tmp_path / "inv.yml")
    assert sorted(hosts) == sorted(reference) == ["gpu1", "gpu2", "gpu3"]
    for name, entry in hosts.items():
        for key, value in reference[name].items():
            if key in inventory.HostEntry.model_fields:
                assert getattr(entry, key) == value, (name, key)
    # the cases that matter, spelled out
    assert [hosts[h].lossbed_mtu for h in ("gpu1", "gpu2", "gpu3")] == [3000, 3000, 9000]
    assert [hosts[h].lossbed_gpus for h in ("gpu1", "gpu2", "gpu3")] == [0, 8, 8]
    assert hosts["gpu1"].ansible_port == 2201 and hosts["gpu2"].ansible_port == 22
    assert hosts["gpu1"].lossbed_project == "/from/group_vars"


def test_host_ranges_expand_as_ansible_writes_them(tmp_path):
    text = ("all:\n  vars: {lossbed_interface: ens6}\n  hosts:\n"
            "    n[08:10].lab:\n    r[a:b]:\n    x[0:6:3]:\n")
    (tmp_path / "host_vars").mkdir()
    names = ["n08.lab", "n09.lab", "n10.lab", "ra", "rb", "x0", "x3", "x6"]
    for i, name in enumerate(names):
        (tmp_path / "host_vars" / f"{name}.yml").write_text(
            f"ansible_host: {name}\nlossbed_address: 10.1.0.{i + 1}\n")
    assert sorted(inventory.load(write(tmp_path, text))) == names


INI = """
[gpus]
gpu[1:2] lossbed_interface=ens6

[gpus:vars]
lossbed_mtu=9000

[rack1]
gpu1 ansible_host=10.0.0.1 lossbed_address=192.168.50.1 ansible_port=2201
"""


def test_an_ini_inventory_is_read_as_ansible_reads_it(tmp_path):
    # the same hosts as a YAML inventory would give: ranges, group vars, a host in two
    # groups, host_vars/ beside the file (before: an INI file was refused)
    path = tmp_path / "hosts.ini"
    path.write_text(INI)
    (tmp_path / "host_vars").mkdir()
    (tmp_path / "host_vars" / "gpu2.yml").write_text(
        "ansible_host: 10.0.0.2\nlossbed_address: 192.168.50.2\n")
    hosts = inventory.load(path)
    assert sorted(hosts) == ["gpu1", "gpu2"]
    assert hosts["gpu1"].ansible_port == 2201 and hosts["gpu2"].ansible_port == 22
    assert {h.lossbed_mtu for h in hosts.values()} == {9000}
    assert hosts["gpu2"].lossbed_address == "192.168.50.2"
    assert isinstance(hosts["gpu1"].lossbed_mtu, int)


def test_an_inventory_ansible_cannot_read_is_refused_by_name(tmp_path):
    path = tmp_path / "hosts.ini"
    path.write_text("[gpus\ngpu1 ansible_host=10.0.0.1\n")
    with pytest.raises(UsageError, match="could not read it as a YAML or INI inventory"):
        inventory.load(path)


def test_reading_an_inventory_leaves_this_process_as_it_was(tmp_path):
    """ansible-core replaces sys.intern when imported, which broke torch._dynamo imported
    after it in the same process (the unit suite's order: this file, then training): the
    inventory is read in a process of its own (mutation caught: reading it here)."""
    import sys

    intern = sys.intern
    inventory.load(write(tmp_path, GOOD))
    assert sys.intern is intern and "ansible" not in sys.modules


@pytest.fixture
def no_ansible(monkeypatch):
    """Ansible's reading fails the test: what is refused must be refused from the text."""
    def ansible(path):
        raise AssertionError("Ansible was asked to read an inventory refused by its text")

    monkeypatch.setattr(inventory, "_ansible_hosts", ansible)


@pytest.mark.parametrize(("text", "words"), [
    ("all:\n  hosts: {}\n  children:\n    gpus:\n      hosts: {}\n", ["lists no hosts"]),
    ("all:\n  children:\n    gpus:\n      hosts:\n        ../etc:\n", ["host name '../etc'"]),
])
def test_what_the_file_itself_shows_is_refused_before_ansible_reads_it(tmp_path, no_ansible,
                                                                       text, words):
    """No hosts, or a host name lossbed refuses: said from the YAML at once, not after the
    second Ansible's parser takes in a process of its own (#57: 1.5-1.8 s before)."""
    with pytest.raises(UsageError) as err:
        inventory.load(write(tmp_path, text))
    for word in words:
        assert word in str(err.value), (word, str(err.value))


@pytest.mark.parametrize(("text", "words"), [
    # a host's own value lossbed refuses (nothing in the file can override a host's own)
    (GOOD.replace("192.168.50.1", "192.168.50.300"),
     ["host gpu1", "lossbed_address", "'192.168.50.300' is not an IP address"]),
    (GOOD.replace("lossbed_interface: ens6\n      lossbed_address: 192.168.50.1",
                  "lossbed_interface: 'eth0; reboot'\n      lossbed_address: 192.168.50.1"),
     ["host gpu1", "lossbed_interface"]),
    # a field no host and no group of the file sets, with no group_vars/ beside it
    (GOOD.replace("      lossbed_interface: ens6\n      lossbed_address: 192.168.50.1\n",
                  "      lossbed_address: 192.168.50.1\n"),
     ["host gpu1", "lossbed_interface is missing"]),
    (GOOD.replace("lossbed_gpus: 2", "lossbed_gpu: 2"),
     ["host gpu1", "unknown key 'lossbed_gpu'", "did you mean lossbed_gpus"]),
])
def test_a_hosts_own_variables_are_refused_before_ansible_reads_them(tmp_path, no_ansible,
                                                                     text, words):
    """A host's own bad variable, or one nothing in the file sets, said from the YAML at
    once (#57: 1.37 s before, Ansible's parser in a process of its own)."""
    with pytest.raises(UsageError) as err:
        inventory.load(write(tmp_path, text))
    for word in words:
        assert word in str(err.value), (word, str(err.value))


@pytest.mark.parametrize("beside", [None, "group_vars", "host_vars"])
def test_what_ansible_may_still_supply_is_left_to_ansible(tmp_path, beside):
    """A field a group sets, or one a group_vars/ folder may set, or a host's own value that
    host_vars/ may override: not refused from the text; Ansible's reading decides."""
    text = GOOD.replace("      lossbed_interface: ens6\n      lossbed_address: 192.168.50.1\n",
                        "      lossbed_address: 192.168.50.300\n")
    if beside is None:  # the interface from the group's vars: only the address is wrong
        text = text.replace("    lossbed_mtu: 9000\n", "    lossbed_mtu: 9000\n"
                            "    lossbed_interface: ens7\n")
    else:
        (tmp_path / beside).mkdir()
        (tmp_path / beside / ("all.yml" if beside == "group_vars" else "gpu1.yml")).write_text(
            "lossbed_interface: ens7\n" + ("lossbed_address: 192.168.50.9\n"
                                           if beside == "host_vars" else ""))
    if beside == "host_vars":
        assert inventory.load(write(tmp_path, text))["gpu1"].lossbed_address == "192.168.50.9"
        return
    with pytest.raises(UsageError) as err:
        inventory.load(write(tmp_path, text))
    assert "'192.168.50.300' is not an IP address" in str(err.value)
    assert "lossbed_interface" not in str(err.value)


def test_a_range_entry_may_supply_hosts_named_elsewhere(tmp_path):
    """gpu[1:2] sets the interface and the SSH address of gpu1 and gpu2, listed again in a
    group with their own addresses: nothing is missing, so nothing is refused early."""
    hosts = inventory.load(write(tmp_path, (
        "all:\n  hosts:\n    gpu[1:2]:\n      lossbed_interface: ens6\n"
        "      ansible_host: 10.0.0.1\n  children:\n    a:\n      hosts:\n"
        "        gpu1: {lossbed_address: 192.168.50.1}\n"
        "        gpu2: {lossbed_address: 192.168.50.2, ansible_port: 2222}\n")))
    assert {n: h.lossbed_interface for n, h in hosts.items()} == {"gpu1": "ens6", "gpu2": "ens6"}
