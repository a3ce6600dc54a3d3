"""A hostile profile changes nothing on the hosts: with a profile applied, `lossbed apply`
of every file in tests/data/hostile_profiles/ exits 2 and leaves every host's qdiscs,
filters, nftables rules and links exactly as they were (the impairment stays applied)."""

from __future__ import annotations

from pathlib import Path

import pytest

from testbed import cli
from testbed.impair import engine

pytestmark = pytest.mark.netns

CORPUS = Path(__file__).resolve().parents[1] / "data" / "hostile_profiles"


def kernel_state(cluster) -> dict:
    """What lossbed could have changed on each host, as the kernel lists it (no counters)."""
    out = {}
    for h in cluster.hosts:
        listings = [["tc", "qdisc", "show"], ["tc", "filter", "show", "dev", h.ifname],
                    ["tc", "filter", "show", "dev", h.ifname, "ingress"],
                    ["nft", "list", "ruleset"], ["ip", "-o", "link", "show"]]
        rows = []
        for argv in listings:
            done = h.run(argv)
            text = done.stdout.decode()
            # packet and byte counts move with any traffic; the rules themselves must not
            rows.append([" ".join(w for w in line.split() if not w.isdigit())
                         for line in text.splitlines() if "counter packets" not in line])
        out[h.name] = rows
    return out


def test_hostile_profiles_leave_the_hosts_as_they_were(make_cluster, capsys):
    cluster = make_cluster(hosts=2)
    assert cli.main(["apply", "random-loss", "--cluster", cluster.name]) == 0
    capsys.readouterr()
    before = kernel_state(cluster)
    record = engine.read_record(cluster)
    assert record and record["status"] == "applied"
    for path in sorted(CORPUS.glob("*.yaml")):
        rc = cli.main(["apply", str(path), "--cluster", cluster.name])
        err = capsys.readouterr().err
        assert rc == 2, (path.name, err)
        assert "Traceback" not in err and str(path) in err
        assert kernel_state(cluster) == before, path.name
    assert engine.read_record(cluster) == record  # the applied profile is still the one
    assert cli.main(["clear", "--cluster", cluster.name]) == 0
