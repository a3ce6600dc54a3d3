"""Bad input to `lossbed up`: one clear message naming the option and the fix, a non-zero
exit, and nothing created on the machine."""

from __future__ import annotations

import os

import pytest

from testbed.clusters import netns as netns_cluster
from testbed.errors import EnvironmentProblem
from testbed.host import namespaces
from tests.helpers import NOTHING, REPO, leftovers, lossbed, unique_name, with_repo_on_path

pytestmark = pytest.mark.netns


def _all_namespaces() -> set[str]:
    return set(namespaces.names())


CASES = [
    # (arguments after --name, words the message must contain)
    (["--hosts", "0"], ["--hosts", "1 or more"]),
    (["--hosts", "-3"], ["--hosts", "1 or more"]),
    (["--hosts", "6", "--subnet", "10.250.7.0/29"], ["--hosts", "do not fit", "room for 5",
                                                      "larger --subnet"]),
    (["--hosts", "2", "--subnet", "banana"], ["--subnet", "not an IPv4 network", "10.201.0.0/24"]),
    (["--hosts", "2", "--subnet", "10.250.0.0/33"], ["--subnet", "not an IPv4 network"]),
    (["--hosts", "2", "--subnet", "10.250.0.7/24"], ["--subnet", "host bits",
                                                     "--subnet 10.250.0.0/24"]),
    (["--hosts", "2", "--subnet", "8.8.8.0/24"], ["--subnet", "not a private range"]),
    (["--hosts", "2", "--subnet", "fd00::/64"], ["--subnet", "IPv6"]),
    (["--hosts", "2", "--mtu", "67"], ["--mtu", "68..65535", "--mtu 1500"]),
    (["--hosts", "2", "--mtu", "65536"], ["--mtu", "68..65535"]),
]


@pytest.mark.parametrize("args,words", CASES, ids=[" ".join(a) for a, _ in CASES])
def test_bad_option_is_refused_and_nothing_is_created(args, words):
    name = unique_name()
    before = _all_namespaces()
    result = lossbed("up", "--name", name, *args)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("lossbed: error: ")
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr  # one message, no trace
    for word in words:
        assert word in result.stderr, (word, result.stderr)
    assert leftovers(name) == NOTHING
    assert _all_namespaces() == before


@pytest.mark.parametrize("name,hosts,words", [
    ("averylongname", 2, ["--name", "1 to 12 lower-case letters and digits"]),
    ("twelvecharsx", 10, ["--name", "'twelvecharsx-h10' 16 bytes", "Linux allows 15",
                          "at most 11 characters"]),
    ("Bad-Name", 2, ["--name", "lower-case letters and digits"]),
    ("1abc", 2, ["--name", "starting with a letter"]),
])
def test_bad_cluster_name_is_refused(name, hosts, words):
    before = _all_namespaces()
    result = lossbed("up", "--hosts", str(hosts), "--name", name)
    assert result.returncode == 2
    for word in words:
        assert word in result.stderr, (word, result.stderr)
    assert _all_namespaces() == before
    assert not os.path.exists(f"/run/lossbed/{name}")


def test_subnet_overlapping_another_cluster_is_refused(make_cluster):
    first = make_cluster(hosts=2, subnet="10.250.0.0/24")
    name = unique_name()
    result = lossbed("up", "--hosts", "2", "--name", name, "--subnet", "10.250.0.0/16")
    assert result.returncode == 2
    assert "--subnet" in result.stderr and "overlaps 10.250.0.0/24" in result.stderr
    assert f"cluster {first.name}" in result.stderr
    assert leftovers(name) == NOTHING


def test_without_root_capabilities_the_message_says_so_and_nothing_is_created():
    import subprocess
    import sys

    name = unique_name()
    before = _all_namespaces()
    # uid 0 but without CAP_NET_ADMIN/CAP_SYS_ADMIN: what a normal user or a confined
    # container sees. (A real unprivileged uid cannot read this venv under /root.)
    result = subprocess.run(
        ["setpriv", "--bounding-set=-net_admin,-sys_admin", sys.executable, "-m", "testbed.cli",
         "up", "--hosts", "2", "--name", name],
        capture_output=True, text=True, cwd=REPO,
        env={**os.environ, "PYTHONPATH": with_repo_on_path()},
    )
    assert result.returncode == 3
    assert "needs root" in result.stderr and "sudo" in result.stderr
    assert "CAP_NET_ADMIN" in result.stderr
    assert leftovers(name) == NOTHING
    assert _all_namespaces() == before


def test_kernel_without_namespaces_gets_a_clear_message(monkeypatch):
    real_exists = os.path.exists
    asked = []

    def exists(path):
        asked.append(path)
        return False if path == "/proc/self/ns/net" else real_exists(path)

    monkeypatch.setattr(os.path, "exists", exists)
    name = unique_name()
    with pytest.raises(EnvironmentProblem, match="does not support network namespaces"):
        netns_cluster.up(netns_cluster.ClusterSpec(hosts=2, name=name))
    assert "/proc/self/ns/net" in asked  # the refusal came from the namespace check
    assert leftovers(name) == NOTHING
