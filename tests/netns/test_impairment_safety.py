"""Bad input never reaches the kernel, and a failure half-way leaves no host impaired."""

from __future__ import annotations

import pytest

from testbed import profiles
from testbed.clusters import state
from testbed.errors import LossbedError
from testbed.impair import bpf, engine, nft
from tests.helpers import lossbed

pytestmark = pytest.mark.netns


def lossbed_objects(cluster) -> dict[str, list[str]]:
    """Every impairment object lossbed could have left on the hosts, read from the kernel."""
    found = {}
    for h in cluster.hosts:
        items = []
        tables = h.run(["nft", "list", "tables"]).stdout.decode()
        if "lossbed" in tables:
            items.append("nft table")
        qdiscs = h.run(["tc", "qdisc", "show", "dev", h.ifname]).stdout.decode()
        if "clsact" in qdiscs or "htb" in qdiscs or "ingress" in qdiscs:
            items.append(qdiscs.strip())
        links = h.run(["ip", "-o", "link"]).stdout.decode()
        if "ifb-" in links:
            items.append("ifb device")
        if items:
            found[h.name] = items
    return found


@pytest.fixture
def cluster(make_cluster):
    return make_cluster(hosts=4)


@pytest.mark.parametrize("args,words", [
    (["random-loss", "--set", "loss_pct=150"], ["impairment.loss.loss_pct", "100"]),
    (["random-loss", "--set", "delay=5"], ["impairment.delay", "delay_ms"]),
    (["random-loss", "--set", "jitter_ms=5ms"], ["jitter_ms", "number"]),
    (["random-loss", "--set", "loss_pct=0", "--set", "correlation_pct=5"],
     ["correlation needs loss"]),
    (["burst-loss", "--set", "impairment.loss.loss_pct=null",
      "--set", "impairment.loss.p_pct=120", "--set", "impairment.loss.r_pct=5",
      "--set", "impairment.loss.mean_burst_packets=null"], ["p_pct", "less than or equal"]),
    (["random-loss", "--set", "delay_ms=-1"], ["delay_ms", "greater than or equal to 0"]),
    (["random-loss", "--set", "match.include=[{protocol: udp, ports: [9-3]}]"],
     ["ports[0]", "empty", "3-9"]),
    (["random-loss", "--set", "hosts.h7.delay_ms=2"], ["hosts.h7", "no host 'h7'"]),
    (["random-loss", "--only", "h1,h9"], ["--only", "no host 'h9'"]),
    (["no-such-profile"], ["PROFILE", "Available"]),
    (["wan"], ["needs delay", "netem", "never approximates"]),
])
def test_bad_input_is_refused_before_the_kernel_is_touched(cluster, args, words):
    result = lossbed("apply", *args, "--cluster", cluster.name)
    assert result.returncode != 0
    for word in words:
        assert word in result.stderr, (word, result.stderr)
    assert "Traceback" not in result.stderr
    assert lossbed_objects(cluster) == {}
    assert engine.read_record(cluster) is None


def test_dry_run_prints_the_plan_and_changes_nothing(cluster):
    result = lossbed("apply", "burst-loss", "--set", "loss_pct=5", "--dry-run",
                     "--cluster", cluster.name)
    assert result.returncode == 0, result.stderr
    assert "backend: bpf" in result.stdout and "h2->h1" in result.stdout
    assert lossbed_objects(cluster) == {}


@pytest.mark.parametrize("backend", ["nft", "bpf"])
@pytest.mark.parametrize("failure", [RuntimeError("injected failure"), KeyboardInterrupt()])
def test_a_failure_on_the_third_host_leaves_no_host_impaired(cluster, monkeypatch, backend,
                                                             failure):
    module = {"nft": nft, "bpf": bpf}[backend]
    real_apply = module.apply
    calls = []

    def failing_apply(host, host_plan):
        calls.append(host.name)
        if len(calls) == 3:
            raise failure
        return real_apply(host, host_plan)

    monkeypatch.setattr(module, "apply", failing_apply)
    the_plan, choice = engine.make_plan(cluster, profiles.load("random-loss"), backend=backend)
    with pytest.raises(type(failure)):
        engine.apply(cluster, the_plan, choice)
    assert len(calls) >= 3  # hosts are applied in parallel: the fourth may have started too
    assert lossbed_objects(cluster) == {}
    assert not (state.cluster_dir(cluster.name) / engine.RECORD).exists()


def test_apply_replaces_clear_removes_and_verify_then_refuses(cluster):
    assert lossbed("apply", "random-loss", "--cluster", cluster.name).returncode == 0
    assert set(lossbed_objects(cluster)) == {"h1", "h2", "h3", "h4"}
    again = lossbed("apply", "burst-loss", "--only", "h2", "--cluster", cluster.name)
    assert again.returncode == 0, again.stderr
    assert set(lossbed_objects(cluster)) == {"h2"}  # the previous profile is gone
    shown = lossbed("show", "--cluster", cluster.name)
    assert "profile burst-loss" in shown.stdout and "h1->h2" in shown.stdout
    assert lossbed("verify", "--cluster", cluster.name).returncode == 0
    assert lossbed("clear", "--cluster", cluster.name).returncode == 0
    assert lossbed_objects(cluster) == {}
    refused = lossbed("verify", "--cluster", cluster.name)
    assert refused.returncode != 0 and "no profile is applied" in refused.stderr


def test_clear_after_a_crash_finds_objects_without_a_record(cluster):
    the_plan, choice = engine.make_plan(cluster, profiles.load("random-loss"), backend="nft")
    engine.apply(cluster, the_plan, choice)
    (state.cluster_dir(cluster.name) / engine.RECORD).unlink()  # as if the record was lost
    engine.clear(cluster)
    assert lossbed_objects(cluster) == {}


def test_verify_refuses_a_map_that_is_gone(cluster):
    the_plan, choice = engine.make_plan(cluster, profiles.load("random-loss"), backend="bpf")
    engine.apply(cluster, the_plan, choice)
    record = engine.read_record(cluster)
    for host in cluster.hosts:
        bpf.clear(host, host.ifname)  # removed behind lossbed's back
    from testbed.impair import verify

    with pytest.raises(LossbedError, match="are gone"):
        verify.verify(cluster)
    assert record["handles"]["h1"]["map_name"].startswith("lb_")
    engine.clear(cluster)
