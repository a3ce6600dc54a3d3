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
    ("hosts: {}\n", ["no top-level 'all' group"]),
    ("all:\n  hosts: {}\n", ["lists no hosts"]),
])
def test_bad_inventories_name_the_problem(tmp_path, text, words):
    with pytest.raises(UsageError) as err:
        inventory.load(write(tmp_path, text))
    for word in words:
        assert word in str(err.value), (word, str(err.value))
