"""Plans are pure: who applies what, and which backend may apply a profile."""

from __future__ import annotations

import pytest

from testbed import profiles
from testbed.errors import LossbedError, UsageError
from testbed.impair import engine, nft, plan

HOSTS = [plan.PlannedHost(f"h{i}", f"10.201.0.{i}", "eth0", 1500) for i in (1, 2, 3, 4)]
ALL_AVAILABLE = {"netem": None, "bpf": None, "nft": None}
NO_NETEM = {"netem": "the kernel has no sch_netem", "bpf": None, "nft": None}


def test_by_default_every_path_crosses_exactly_one_impairment_point():
    p = plan.build(profiles.load("random-loss", ["loss_pct=10"]), HOSTS, "bpf")
    points = {}
    for hp in p.hosts:
        for rule in hp.rules:
            assert rule.direction == "ingress"
            points.setdefault(rule.path(hp.host), []).append(hp.host)
    # 4 hosts: 12 directed paths, each impaired once, at its receiver.
    assert len(points) == 12
    assert all(len(at) == 1 and path.endswith(f"->{at[0]}") for path, at in points.items())


def test_direction_both_impairs_each_path_twice():
    p = plan.build(profiles.load("random-loss", ["direction=both"]), HOSTS, "bpf")
    count = {}
    for hp in p.hosts:
        for rule in hp.rules:
            count[rule.path(hp.host)] = count.get(rule.path(hp.host), 0) + 1
    assert set(count.values()) == {2}


def test_overrides_host_then_link_field_by_field():
    prof = profiles.load("asymmetric", ["hosts.h4.delay_ms=5", "hosts.h4.loss=null"])
    p = plan.build(prof, HOSTS, "netem")
    rules = {r.path(hp.host): r.impairment for hp in p.hosts for r in hp.rules}
    assert rules["h1->h2"].loss.loss_pct == 5.0          # link override
    assert rules["h2->h1"].loss.loss_pct == 0.1          # the other direction differs
    assert rules["h1->h3"].loss.model == "gilbert_elliott"  # host override (into h3)
    assert rules["h2->h4"].delay_ms == 5 and rules["h2->h4"].loss is None
    assert rules["h3->h1"].loss.loss_pct == 0.5          # default


def test_hosts_subset_and_unknown_hosts():
    p = plan.build(profiles.load("random-loss"), HOSTS, "nft", only=["h2"])
    assert [hp.host for hp in p.hosts] == ["h2"]
    with pytest.raises(UsageError, match=r"hosts.h9.*no host 'h9'.*h1, h2, h3, h4"):
        plan.build(profiles.load("random-loss", ["hosts.h9.delay_ms=1"]), HOSTS, "netem")
    with pytest.raises(UsageError, match=r"links\[0\].dst"):
        plan.build(profiles.load("random-loss", ["links=[{src: h1, dst: h7}]"]), HOSTS, "nft")
    with pytest.raises(UsageError, match="--only"):
        plan.build(profiles.load("random-loss"), HOSTS, "nft", only=["h5"])


def test_describe_and_dict_are_printable():
    p = plan.build(profiles.load("burst-loss", ["loss_pct=10"]), HOSTS[:2], "bpf")
    text = p.describe()
    assert "h2->h1" in text and "GE p=1.111% r=10%" in text and "except tcp 22" in text
    d = p.to_dict()
    assert d["hosts"][0]["rules"][0]["path"] == "h2->h1"


@pytest.mark.parametrize("profile,probes,expected", [
    ("random-loss", ALL_AVAILABLE, "netem"),
    ("random-loss", NO_NETEM, "bpf"),
    ("burst-loss", NO_NETEM, "bpf"),
    ("burst-loss", ALL_AVAILABLE, "bpf"),  # netem cannot end a burst by time
    ("random-loss", {"netem": "no", "bpf": "no bpf", "nft": None}, "nft"),
    ("wan", ALL_AVAILABLE, "netem"),
])
def test_backend_choice(profile, probes, expected):
    assert engine.choose(profiles.load(profile), HOSTS, probes).backend == expected


def test_packet_only_bursts_use_netem_and_a_forced_netem_refuses_a_burst_time_limit():
    packet_only = profiles.load("burst-loss", ["max_burst_ms=0"])
    assert engine.choose(packet_only, HOSTS, ALL_AVAILABLE).backend == "netem"
    with pytest.raises(LossbedError, match="time limit on Gilbert-Elliott bursts"):
        engine.choose(profiles.load("burst-loss"), HOSTS, ALL_AVAILABLE, "netem")


def test_a_profile_no_available_backend_can_express_is_refused_with_what_would_work():
    with pytest.raises(LossbedError) as err:
        engine.choose(profiles.load("wan"), HOSTS, NO_NETEM)
    msg = str(err.value)
    assert "needs delay" in msg and "rate limit" in msg
    assert "bpf cannot do" in msg and "Backends that could: netem" in msg
    assert "--kind vm" in msg and "never approximates" in msg
    with pytest.raises(LossbedError, match="Gilbert-Elliott"):
        engine.choose(profiles.load("burst-loss"), HOSTS,
                      {"netem": "x", "bpf": "x", "nft": None})
    with pytest.raises(LossbedError, match="seed, which the nft backend cannot do"):
        engine.choose(profiles.load("random-loss", ["seed=7"]), HOSTS, ALL_AVAILABLE, "nft")
    with pytest.raises(LossbedError, match="loss correlation"):
        engine.choose(profiles.load("random-loss", ["correlation_pct=5"]), HOSTS, NO_NETEM)


def test_nft_ruleset_text():
    prof = profiles.load("random-loss", ["loss_pct=10",
                                         "match.include=[{protocol: udp, ports: [5000-5100]}]"])
    text = nft.render(plan.build(prof, HOSTS[:2], "nft").hosts[0])
    assert 'type filter hook ingress device "eth0" priority -500' in text
    assert ('meta l4proto tcp th sport { 22, 29499, 29500 } counter name "exempt_in" accept'
            in text)  # what the exclusions let through is counted apart
    assert "counter exempt_in { }" in text and "exempt_out" not in text
    assert "ip saddr 10.201.0.2 jump in_h2" in text
    assert "meta l4proto udp th dport { 5000-5100 } goto impair_in_h2" in text
    assert "numgen random mod 1000000000 < 100000000" in text
    clean = nft.render(plan.build(profiles.load("clean"), HOSTS[:2], "nft").hosts[0])
    assert 'counter name "seen_in_h2"' in clean and "numgen" not in clean


class _ProbedHost:
    def __init__(self, name: str, probes: dict):
        self.name, self.address, self.ifname, self._probes = name, "10.0.0.1", "eth0", probes

    def agent_call(self, op: str, payload: dict):
        assert op == "probe"
        return self._probes


def test_every_host_is_probed_and_a_mixed_cluster_gets_what_all_of_them_have():
    from testbed.impair.engine import choose, probe_all

    hosts = [_ProbedHost("h1", ALL_AVAILABLE), _ProbedHost("h2", NO_NETEM),
             _ProbedHost("h3", ALL_AVAILABLE)]
    probes = probe_all(hosts)
    assert probes["bpf"] is None and probes["nft"] is None
    assert probes["netem"].startswith("h2: the kernel has no sch_netem")
    assert "the other 2 hosts have it" in probes["netem"]
    # random loss would take netem on h1 alone; on this cluster it is bpf, and says why
    choice = choose(profiles.load("random-loss", ["loss_pct=10"]), hosts, probes)
    assert choice.backend == "bpf" and "h2: the kernel has no sch_netem" in choice.reason
    # a profile only netem can apply is refused, naming the host that lacks it
    with pytest.raises(LossbedError, match="h2: the kernel has no sch_netem"):
        choose(profiles.load("wan"), hosts, probes)


def test_a_backend_missing_everywhere_is_reported_once():
    from testbed.impair.engine import probe_all

    probes = probe_all([_ProbedHost(f"h{i}", NO_NETEM) for i in (1, 2)])
    assert probes["netem"] == "the kernel has no sch_netem"


def test_training_impairs_the_rendezvous_port_and_lists_what_stays_exempt():
    from harness.train.run import impair_the_control_path
    from testbed import ports

    profile = profiles.load("random-loss", ["loss_pct=10"])
    assert any(r.first <= ports.RENDEZVOUS <= r.last
               for f in profile.match.exclude for r in f.ports)  # apply keeps it reliable
    training, exempt = impair_the_control_path(profile)
    assert not any(r.first <= ports.RENDEZVOUS <= r.last
                   for f in training.match.exclude for r in f.ports)
    assert exempt[0].startswith("setup (rendezvous, gloo's connections, DDP's")
    assert exempt[1].startswith("the evaluation after training")
    assert exempt[2:] == ["tcp ports 22, 29499"]
    # a range around the port is cut in two, nothing else changes
    wide = profiles.load("random-loss", ["match.exclude=[{protocol: tcp, ports: [29000-30000]}]"])
    cut, listed = impair_the_control_path(wide)
    assert [str(r) for r in cut.match.exclude[0].ports] == ["29000-29499", "29501-30000"]
    assert training.impairment == profile.impairment
