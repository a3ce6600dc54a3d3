"""What coverage reads on a host (testbed/impair/coverage.py): every interface's counters
from netlink, named and typed as the judge uses them, and the RDMA ports' data counters from
sysfs, in bytes, hardware devices only. Read here from a planted netlink and a planted
/sys/class/infiniband, whose every value is known (#71)."""

from __future__ import annotations

import contextlib
import socket

from testbed.impair import coverage


class _Message(dict):
    """A netlink message as pyroute2 gives one: fields by key, attributes by get_attr."""

    def __init__(self, fields: dict, attrs: dict):
        super().__init__(fields)
        self.attrs = attrs

    def get_attr(self, name):
        return self.attrs.get(name)

    def __bool__(self):  # pyroute2's messages are true even without fields
        return True


class _Netlink:
    def __init__(self, links, addressed):
        self.links, self.addressed = links, addressed
        self.asked_family = None

    def get_addr(self, family):
        self.asked_family = family
        return [{"index": i} for i in self.addressed]

    def get_links(self):
        return self.links


class _Host:
    def __init__(self, ipr):
        self.ipr = ipr

    @contextlib.contextmanager
    def netlink(self):
        yield self.ipr


def _link(index, name, flags=0, ifi_type=1, kind=None, stats64=None, stats=None):
    attrs = {"IFLA_IFNAME": name}
    if stats64 is not None:
        attrs["IFLA_STATS64"] = stats64
    if stats is not None:
        attrs["IFLA_STATS"] = stats
    if kind is not None:
        attrs["IFLA_LINKINFO"] = _Message({}, {"IFLA_INFO_KIND": kind})
    return _Message({"index": index, "flags": flags, "ifi_type": ifi_type}, attrs)


def test_every_interfaces_counters_are_read_with_what_the_judge_needs(tmp_path, monkeypatch):
    monkeypatch.setattr(coverage, "RDMA_ROOT", tmp_path / "none")
    ipr = _Netlink([
        _link(1, "lo", flags=0x8 | 0x1, ifi_type=772,
              stats64={"rx_packets": 5, "rx_bytes": 500, "tx_packets": 5, "tx_bytes": 500}),
        _link(2, "veth0", kind="veth", flags=0x1,
              stats64={"rx_packets": 10, "rx_bytes": 1400, "tx_packets": 7, "tx_bytes": 980,
                       "multicast": 3}),
        # an old kernel's 32-bit counters stand in where there are no 64-bit ones
        _link(3, "ifb0", kind="ifb", stats={"rx_packets": 2, "rx_bytes": "300"}),
        _link(4, "wg0", ifi_type=65534),  # no counters at all: zeros
    ], addressed=[2, 4])
    read = coverage.read_traffic(_Host(ipr))
    assert ipr.asked_family == socket.AF_INET
    assert read == {"rdma": {}, "interfaces": {
        "lo": {"kind": "", "loopback": True, "addressed": False, "header_bytes": 0,
               "rx_packets": 5, "rx_bytes": 500, "tx_packets": 5, "tx_bytes": 500},
        "veth0": {"kind": "veth", "loopback": False, "addressed": True, "header_bytes": 14,
                  "rx_packets": 10, "rx_bytes": 1400, "tx_packets": 7, "tx_bytes": 980},
        "ifb0": {"kind": "ifb", "loopback": False, "addressed": False, "header_bytes": 14,
                 "rx_packets": 2, "rx_bytes": 300, "tx_packets": 0, "tx_bytes": 0},
        "wg0": {"kind": "", "loopback": False, "addressed": True, "header_bytes": 0,
                "rx_packets": 0, "rx_bytes": 0, "tx_packets": 0, "tx_bytes": 0}}}
    assert all(type(v) is int for i in read["interfaces"].values() for k, v in i.items()
               if k.endswith(("_packets", "_bytes")))


def _port(root, device, port, counters: dict | None, hardware=True):
    folder = root / device
    (folder / "ports" / port).mkdir(parents=True)
    if hardware:
        (folder / "device").mkdir(exist_ok=True)
    if counters is not None:
        (folder / "ports" / port / "counters").mkdir()
        for name, value in counters.items():
            (folder / "ports" / port / "counters" / name).write_text(f"{value}\n")


COUNTERS = {"port_rcv_data": 250, "port_xmit_data": 100, "port_rcv_packets": 9,
            "port_xmit_packets": 4}


def test_rdma_ports_are_read_in_bytes_for_hardware_devices_only(tmp_path):
    _port(tmp_path, "mlx5_1", "1", COUNTERS)
    _port(tmp_path, "mlx5_0", "1", {**COUNTERS, "port_rcv_data": 1})
    _port(tmp_path, "mlx5_0", "2", {**COUNTERS, "port_xmit_data": "x"})  # unreadable: skipped
    _port(tmp_path, "mlx5_0", "3", None)                                 # no counters: skipped
    _port(tmp_path, "mlx5_0", "4", COUNTERS)                             # and after them, read
    _port(tmp_path, "rxe0", "1", COUNTERS, hardware=False)                # Soft-RoCE: a netdev's
    _port(tmp_path, "vmw_pvrdma0", "1", COUNTERS)                        # hardware after it
    ports = coverage.read_rdma_ports(tmp_path)
    assert list(ports) == ["mlx5_0/1", "mlx5_0/4", "mlx5_1/1", "vmw_pvrdma0/1"]
    assert ports["mlx5_1/1"] == {"rx_bytes": 1000, "tx_bytes": 400, "rx_packets": 9,
                                 "tx_packets": 4}
    assert ports["mlx5_0/1"]["rx_bytes"] == 4
    assert coverage.rdma_devices(tmp_path) == ["mlx5_0", "mlx5_1", "vmw_pvrdma0"]


def test_a_port_missing_one_counter_is_skipped_and_the_rest_still_read(tmp_path):
    _port(tmp_path, "mlx5_0", "1", {k: v for k, v in COUNTERS.items()
                                    if k != "port_xmit_packets"})
    _port(tmp_path, "mlx5_0", "2", COUNTERS)
    assert list(coverage.read_rdma_ports(tmp_path)) == ["mlx5_0/2"]


def test_a_machine_without_rdma_has_no_ports_and_no_devices(tmp_path):
    assert coverage.read_rdma_ports(tmp_path / "absent") == {}
    assert coverage.rdma_devices(tmp_path / "absent") == []
    (tmp_path / "file").write_text("")
    assert coverage.read_rdma_ports(tmp_path / "file") == {}
    assert coverage.rdma_devices(tmp_path / "file") == []


def test_the_host_operation_reads_the_rdma_root_it_is_pointed_at(tmp_path, monkeypatch):
    _port(tmp_path, "mlx5_0", "1", COUNTERS)
    monkeypatch.setattr(coverage, "RDMA_ROOT", tmp_path)
    # read_traffic's default is the module's root at call time
    read = coverage.read_traffic(_Host(_Netlink([], [])))
    assert coverage.rdma_devices() == ["mlx5_0"]
    assert read == {"interfaces": {}, "rdma": {"mlx5_0/1": {
        "rx_bytes": 1000, "tx_bytes": 400, "rx_packets": 9, "tx_packets": 4}}}
