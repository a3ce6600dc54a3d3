import io
import ipaddress

import pytest

from testbed.clusters import addressing, naming, state
from testbed.errors import ClusterError, UsageError
from testbed.progress import Progress


def test_names_carry_the_cluster_prefix_and_round_trip():
    assert naming.host_namespace("demo", "h3") == "lossbed-demo-h3"
    assert naming.switch_namespace("demo") == "lossbed-demo-switch"
    assert naming.cluster_of_namespace("lossbed-demo-h3") == "demo"
    assert naming.cluster_of_namespace("lossbed-demo-switch") == "demo"
    # Not ours: another tool's namespace, or a malformed one.
    assert naming.cluster_of_namespace("docker-abc") is None
    assert naming.cluster_of_namespace("lossbed-") is None
    assert naming.cluster_of_namespace("lossbed-Demo-h1") is None


def test_cluster_a_never_claims_the_objects_of_cluster_ab():
    # Names have no '-', so the prefix lossbed-a- cannot match lossbed-ab-...
    assert naming.cluster_of_namespace("lossbed-ab-h1") == "ab"
    with pytest.raises(UsageError):
        naming.validate_cluster_name("a-b", 2)


@pytest.mark.parametrize("hosts,longest", [(9, 12), (10, 11), (100, 10)])
def test_interface_name_limit_depends_on_the_host_count(hosts, longest):
    naming.validate_cluster_name("x" * longest, hosts)
    with pytest.raises(UsageError, match=f"at most {longest} characters|1 to {longest} "):
        naming.validate_cluster_name("x" * (longest + 1), hosts)


def test_capacity_keeps_network_broadcast_and_controller_addresses():
    assert addressing.capacity(ipaddress.ip_network("10.0.0.0/24")) == 253
    assert addressing.capacity(ipaddress.ip_network("10.0.0.0/29")) == 5
    assert addressing.capacity(ipaddress.ip_network("10.0.0.0/31")) == 0


def test_addresses_and_controller_address_do_not_collide():
    net = ipaddress.ip_network("10.9.0.0/29")
    hosts = addressing.host_addresses(net, addressing.capacity(net))
    assert hosts == ["10.9.0.1", "10.9.0.2", "10.9.0.3", "10.9.0.4", "10.9.0.5"]
    assert addressing.controller_address(net) == "10.9.0.6"


def test_pick_free_skips_taken_ranges_and_grows_for_many_hosts():
    taken = [(ipaddress.ip_network("10.201.0.0/24"), "cluster a"),
             (ipaddress.ip_network("10.201.1.128/25"), "a route of this machine")]
    assert str(addressing.pick_free(4, taken)) == "10.201.2.0/24"
    big = addressing.pick_free(300, taken)
    assert big.prefixlen == 23 and not any(big.overlaps(n) for n, _ in taken)


def test_overlap_names_the_owner():
    with pytest.raises(UsageError, match=r"overlaps 10.1.0.0/16 \(cluster x\)"):
        addressing.check_no_overlap(ipaddress.ip_network("10.1.2.0/24"),
                                    [(ipaddress.ip_network("10.1.0.0/16"), "cluster x")])


def test_state_claim_is_exclusive_and_forget_removes_everything(tmp_path, monkeypatch):
    monkeypatch.setenv(state.STATE_ROOT_ENV, str(tmp_path / "run"))
    state.claim("demo")
    state.write("demo", {"status": "building"})
    with pytest.raises(ClusterError, match="already up"):
        state.claim("demo")
    assert state.read("demo") == {"status": "building"}
    assert state.recorded_clusters() == ["demo"]
    (state.cluster_dir("demo") / state.CLUSTER_FILE).write_text('{"cut sho')
    assert state.read("demo") is None  # a record cut short by a crash
    state.forget("demo")
    assert not (tmp_path / "run").exists()


def test_progress_is_silent_for_quick_work_and_reports_slow_work():
    quick = io.StringIO()
    p = Progress("up", 3, stream=quick, show_after_s=10)
    for _ in range(3):
        p.advance("hosts")
    p.finish()
    assert quick.getvalue() == ""
    slow = io.StringIO()
    p = Progress("up", 4, stream=slow, show_after_s=0)
    p.advance("hosts")
    p.advance("hosts")
    lines = slow.getvalue().splitlines()
    assert lines[0].startswith("up: 1/4 hosts") and "s left" in lines[0]
    assert lines[1].startswith("up: 2/4 hosts")
