"""Teardown removes exactly what a cluster made: after `down`, after a failure half-way
through `up`, and after the controller is SIGKILLed in the middle of `up`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from testbed import clusters
from testbed.clusters import netns as netns_cluster
from testbed.clusters import state
from testbed.host.hosts import is_running, processes_in_namespaces
from tests.helpers import NOTHING, REPO, leftovers, lossbed, unique_name, with_repo_on_path

pytestmark = pytest.mark.netns


def _kill_self_during_up(name: str, hosts: int, after_calls: int, patch: str) -> int:
    """Run `lossbed up` in a child that SIGKILLs itself on the n-th call of `patch`."""
    module, func = patch.rsplit(".", 1)
    script = textwrap.dedent(f"""
        import os, signal, sys
        import {module} as target
        from testbed import cli
        original = target.{func}
        calls = 0
        def dying(*args, **kwargs):
            global calls
            calls += 1
            if calls > {after_calls}:
                os.kill(os.getpid(), signal.SIGKILL)
            return original(*args, **kwargs)
        target.{func} = dying
        sys.exit(cli.main(["up", "--hosts", "{hosts}", "--name", "{name}", "--ssh"]))
    """)
    child = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True,
                           env={**os.environ, "PYTHONPATH": with_repo_on_path()}, timeout=60)
    return child.returncode


def test_down_after_sigkill_while_sshd_was_starting():
    name = unique_name()
    rc = _kill_self_during_up(name, hosts=4, after_calls=2, patch="testbed.clusters.sshd.start")
    assert rc == -signal.SIGKILL
    # It really died in the middle: the record says so, namespaces (4 hosts, the switch and
    # the --ssh controller) and two sshd exist.
    assert state.read(name)["status"] == "building"
    namespaces = netns_cluster.cluster_namespaces(name)
    assert len(namespaces) == 6 and f"lossbed-{name}-ctl" in namespaces
    sshd_pids = [p for pids in processes_in_namespaces(namespaces).values() for p in pids]
    assert len(sshd_pids) == 2
    status = lossbed("status", name)
    assert status.returncode != 0 and "incomplete" in status.stderr
    down = lossbed("down", name)
    assert down.returncode == 0, down.stderr
    assert leftovers(name) == NOTHING
    for pid in sshd_pids:
        assert not is_running(pid), f"sshd {pid} survived down"


def test_down_after_sigkill_before_the_record_is_complete():
    """Killed after two namespaces; the record is then lost too: down works by prefix alone."""
    name = unique_name()
    rc = _kill_self_during_up(name, hosts=6, after_calls=2, patch="testbed.host.namespaces.create")
    assert rc == -signal.SIGKILL
    assert len(netns_cluster.cluster_namespaces(name)) == 2
    state.forget(name)
    up_again = lossbed("up", "--hosts", "2", "--name", name)
    assert up_again.returncode != 0 and f"lossbed down {name}" in up_again.stderr
    assert lossbed("down", name).returncode == 0
    assert leftovers(name) == NOTHING


def test_down_after_sigkill_at_an_arbitrary_moment_of_a_big_up():
    """Not staged: the controller is killed as soon as the cluster's state folder appears."""
    name = unique_name()
    child = subprocess.Popen(
        [sys.executable, "-m", "testbed.cli", "up", "--hosts", "32", "--name", name],
        cwd=REPO, env={**os.environ, "PYTHONPATH": with_repo_on_path()},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while not state.cluster_dir(name).exists() and time.monotonic() < deadline:
        time.sleep(0.001)
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=10)
    assert lossbed("down", name).returncode == 0
    assert leftovers(name) == NOTHING


def test_failure_half_way_through_up_leaves_nothing(monkeypatch):
    name = unique_name()
    original = netns_cluster._write_hosts_file
    calls = []

    def failing(cluster, host):
        calls.append(host.name)
        if len(calls) == 3:
            raise OSError("disk full (injected)")
        original(cluster, host)

    monkeypatch.setattr(netns_cluster, "_write_hosts_file", failing)
    with pytest.raises(OSError, match="injected"):
        netns_cluster.up(netns_cluster.ClusterSpec(hosts=4, name=name, ssh=True))
    assert leftovers(name) == NOTHING


def test_down_of_one_cluster_leaves_the_other_alone(make_cluster):
    keep = make_cluster(hosts=2)
    gone = make_cluster(hosts=2)
    assert lossbed("down", gone.name).returncode == 0
    assert leftovers(gone.name) == NOTHING
    assert len(netns_cluster.cluster_namespaces(keep.name)) == 3
    h1, h2 = keep.hosts
    assert h1.run(["ping", "-c", "1", "-W", "2", h2.address]).returncode == 0


def test_down_is_idempotent_and_names_default_to_the_only_cluster():
    others = clusters.known_clusters()
    if others:  # said, not skipped in silence: the default-name rule needs a quiet machine
        pytest.skip(f"other lossbed clusters are up on this machine ({', '.join(others)}): "
                    "the default cluster name cannot be tested")
    name = unique_name()
    assert lossbed("up", "--hosts", "1", "--name", name).returncode == 0
    status = lossbed("status", "--json")
    assert status.returncode == 0 and f'"name": "{name}"' in status.stdout
    other = unique_name()
    assert lossbed("up", "--hosts", "1", "--name", other).returncode == 0
    ambiguous = lossbed("status")
    lossbed("down", other)
    assert ambiguous.returncode != 0
    assert "say which with lossbed status NAME" in ambiguous.stderr
    assert lossbed("down", name).returncode == 0
    assert lossbed("down", name).returncode == 0
    assert leftovers(name) == NOTHING
