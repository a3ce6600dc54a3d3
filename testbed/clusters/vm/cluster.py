"""The VM cluster kind: each host a qemu VM with the distribution's kernel, its virtio NIC on
a tap device joined to the cluster's switch (the same switch, addressing, MTU and offload
rules as the namespace kind), its exec channel on virtio-serial.

qemu runs inside the switch namespace, so its tap devices are made there and `lossbed down`
finds the qemu processes by that namespace, also after the controller was SIGKILLed.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import logging
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from testbed.clusters import naming, preflight, state, switch
from testbed.clusters import netns as netns_cluster
from testbed.clusters.contract import HostsLossbedOwns
from testbed.clusters.vm import channel, image, kernel
from testbed.errors import ClusterError, EnvironmentProblem, LossbedError, UsageError
from testbed.progress import Progress

log = logging.getLogger(__name__)

KIND = "vm"
DEFAULT_MEMORY_MB = 768
QEMU_OVERHEAD_MB = 160      # qemu's own memory beside the guest's
KEEP_FREE_MB = 1024         # never plan the machine into swapping
BOOT_TIMEOUT_S = 180        # TCG on a busy 2-core machine is slow
PROJECT_ROOT = Path(__file__).resolve().parents[3]
RDMA_COMMANDS = ("rdma", "ibv_devices")
PYVERBS = Path("/usr/lib/python3/dist-packages/pyverbs")


@dataclass
class VMSpec:
    hosts: int
    name: str = naming.DEFAULT_CLUSTER_NAME
    mtu: int = 1500
    subnet: str | None = None
    ssh: bool = False
    rdma: bool = False
    memory_mb: int = DEFAULT_MEMORY_MB


@dataclass(frozen=True)
class VMHost:
    """A host that is a VM: commands go through its exec channel, host-side lossbed work
    through `python -m testbed.host.agent` inside it."""

    name: str
    address: str
    ifname: str
    channel: str
    python: str = sys.executable
    project: str = str(PROJECT_ROOT)

    @property
    def gpus(self) -> int:
        return 0  # a VM has no GPU passed through: one rank

    @property
    def mgmt_address(self) -> str:
        return ""  # its one NIC carries SSH too

    def run(self, argv, *, check=False, timeout=None, input=None):
        return channel.run(Path(self.channel), argv, check=check, timeout=timeout, input=input,
                           env={"PYTHONPATH": self.project}, cwd=self.project)

    def exec_passthrough(self, argv) -> int:
        data = b"" if sys.stdin.isatty() else sys.stdin.buffer.read()
        result = self.run(argv, input=data)
        sys.stdout.buffer.write(result.stdout)
        sys.stderr.buffer.write(result.stderr)
        sys.stdout.flush()
        return result.returncode

    def popen(self, argv, *, env=None, cwd=None, **_):
        """A long-running process in the VM (a rank), followed through the exec channel.
        Its output comes as text lines; env adds to the guest's own environment."""
        from testbed.clusters.vm.process import GuestProcess

        return GuestProcess(Path(self.channel), argv, {"PYTHONPATH": self.project,
                                                       **(env or {})}, cwd or self.project)

    def netlink(self):
        raise LossbedError(f"host {self.name} is a VM: its netlink work runs inside it "
                           "(testbed.host.agent), not from the controller")

    def socket(self, family=None, kind=None):
        raise LossbedError(f"host {self.name} is a VM: its sockets live inside it, not in "
                           "the controller")

    def offloads(self, ifname: str | None = None) -> dict[str, bool]:
        raise LossbedError(f"host {self.name} is a VM: its offloads are read inside it "
                           "(lossbed doctor's checkup runs there)")

    def agent_call(self, op: str, payload: dict):
        """testbed.host.agent's operation, served by the guest process itself (see guest.py)."""
        reply = channel.call(Path(self.channel), {
            "agent_op": op, "payload": payload,
            "host": {"name": self.name, "address": self.address, "ifname": self.ifname}},
            timeout_s=300)
        if "error" in reply:
            raise LossbedError(f"host {self.name}: {reply['error']}")
        return reply["result"]

    def to_dict(self) -> dict:
        return {"name": self.name, "address": self.address, "ifname": self.ifname,
                "channel": self.channel, "python": self.python, "project": self.project}


@dataclass
class VMCluster(HostsLossbedOwns):
    name: str
    subnet: ipaddress.IPv4Network
    mtu: int
    ssh: bool
    rdma: bool
    memory_mb: int
    accel: str
    kernel: str
    hosts: list[VMHost]
    kind: str = field(default=KIND, init=False)

    # ---- the Cluster contract (testbed/clusters/contract.py; the rest: HostsLossbedOwns) -

    @property
    def shares_this_machine(self) -> bool:
        return False  # each VM runs its own kernel and processes

    def rank_python(self, host) -> str:
        return host.python

    @property
    def switch_namespace(self) -> str:
        return naming.switch_namespace(self.name)

    @property
    def state_dir(self) -> Path:
        return state.cluster_dir(self.name)

    def record(self, status: str) -> dict:
        return {"kind": KIND, "name": self.name, "status": status, "subnet": str(self.subnet),
                "mtu": self.mtu, "ssh": self.ssh, "rdma": self.rdma,
                "memory_mb": self.memory_mb, "accel": self.accel, "kernel": self.kernel,
                "switch_namespace": self.switch_namespace,
                "hosts": [h.to_dict() for h in self.hosts]}

    @classmethod
    def from_record(cls, record: dict) -> VMCluster:
        return cls(name=record["name"], subnet=ipaddress.ip_network(record["subnet"]),
                   mtu=record["mtu"], ssh=record["ssh"], rdma=record["rdma"],
                   memory_mb=record["memory_mb"], accel=record["accel"],
                   kernel=record["kernel"], hosts=[VMHost(**h) for h in record["hosts"]])

    def status(self) -> dict:
        """What each VM's kernel says now: address, MTU, offloads, sshd, RDMA device."""
        with ThreadPoolExecutor(max_workers=len(self.hosts)) as pool:
            hosts = list(pool.map(_guest_status, self.hosts))
        out = {"name": self.name, "kind": KIND, "subnet": str(self.subnet), "mtu": self.mtu,
               "accel": self.accel, "kernel": self.kernel,
               "switch_namespace": self.switch_namespace, "hosts": hosts}
        if self.ssh:
            from testbed.clusters import sshd
            out["ssh"] = {"user": "root", "port": sshd.SSH_PORT,
                          "key": str(sshd.client_key(self.state_dir)),
                          "known_hosts": str(sshd.known_hosts(self.state_dir))}
        return out


_STATUS_SCRIPT = r"""
import json, re, subprocess, os
def sh(*a):
    return subprocess.run(a, capture_output=True, text=True).stdout
link = json.loads(sh("ip", "-j", "link", "show", "eth0"))[0]
addrs = json.loads(sh("ip", "-j", "addr", "show", "eth0"))[0]["addr_info"]
merging = re.compile(r"(-segmentation$|^tx-gso-|^rx-gro|^rx-lro$|^rx-udp-gro-forwarding$)")
offloads = {}
for line in sh("ethtool", "-k", "eth0").splitlines():
    name, _, value = line.strip().partition(": ")
    if merging.search(name):
        offloads[name] = value.startswith("on")
sshd = subprocess.run(["pgrep", "-x", "sshd"], capture_output=True, text=True).stdout.split()
rdma = sh("rdma", "link", "show").split() if os.path.exists("/sys/class/infiniband") else []
print(json.dumps({"mtu": link["mtu"], "state": link["operstate"],
                  "kernel_addresses": [f"{a['local']}/{a['prefixlen']}" for a in addrs],
                  "offloads": offloads, "sshd_pid": int(sshd[0]) if sshd else None,
                  "kernel": os.uname().release, "rdma": " ".join(rdma) or None}))
"""


def _guest_status(host: VMHost) -> dict:
    result = host.run(["python3", "-c", _STATUS_SCRIPT], timeout=60)
    if result.returncode != 0:
        raise LossbedError(f"host {host.name}: status failed: {result.stderr.decode()[-500:]}")
    found = json.loads(result.stdout)
    return {"name": host.name, "interface": host.ifname, "address": host.address, **found}


# ---- up ----------------------------------------------------------------------------------


def _check_memory(spec: VMSpec) -> None:
    available_mb = 0
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                available_mb = int(line.split()[1]) // 1024
    need = spec.hosts * (spec.memory_mb + QEMU_OVERHEAD_MB)
    if need > available_mb - KEEP_FREE_MB:
        fits = max((available_mb - KEEP_FREE_MB) // (spec.memory_mb + QEMU_OVERHEAD_MB), 0)
        raise UsageError("--hosts", f"{spec.hosts} VMs of {spec.memory_mb} MB need about "
                         f"{need} MB, and {available_mb} MB are available (keeping "
                         f"{KEEP_FREE_MB} MB free)",
                         f"Use --hosts {fits} or fewer, or a smaller --memory-mb")


def _check_rdma() -> None:
    missing = [c for c in RDMA_COMMANDS if shutil.which(c) is None]
    if missing or not PYVERBS.is_dir():
        raise EnvironmentProblem(
            "--rdma needs rdma-core on this machine (the VMs run its tools): missing "
            + ", ".join(missing + ([] if PYVERBS.is_dir() else ["pyverbs"]))
            + ". Install rdma-core ibverbs-utils python3-pyverbs (make setup-rdma does)")


def validate(spec: VMSpec):
    if spec.memory_mb < 256:
        raise UsageError("--memory-mb", f"{spec.memory_mb} MB is too little for a VM that "
                         "runs Python", "Use --memory-mb 512 or more")
    _check_memory(spec)  # (before the namespaces' own limit: memory is what VMs run out of)
    return netns_cluster.validate(netns_cluster.ClusterSpec(
        hosts=spec.hosts, name=spec.name, mtu=spec.mtu, subnet=spec.subnet, ssh=spec.ssh))


def up(spec: VMSpec) -> VMCluster:
    preflight.require_root("lossbed up --kind vm")
    preflight.require_namespaces()
    image.require_qemu()
    guest = kernel.find_kernel()
    kernel.find_busybox()  # (after the kernel: an empty cache is named as `make setup`'s)
    if spec.rdma:
        _check_rdma()
    base = validate(spec)
    if netns_cluster.cluster_namespaces(spec.name) and not state.read(spec.name):
        raise ClusterError(f"objects of an earlier cluster {spec.name!r} are still present: "
                           f"remove them with: lossbed down {spec.name}")
    state_dir = state.claim(spec.name)
    cluster = VMCluster(
        name=spec.name, subnet=base.subnet, mtu=spec.mtu, ssh=spec.ssh, rdma=spec.rdma,
        memory_mb=spec.memory_mb, accel="?", kernel=guest.version,
        hosts=[VMHost(name=h.name, address=h.address, ifname="eth0",
                      channel=str(state_dir / f"{h.name}.sock")) for h in base.hosts])
    started = time.monotonic()
    try:
        state.write(spec.name, cluster.record("building"))
        _build(cluster, guest)
        state.write(spec.name, cluster.record("up"))
    except BaseException:
        log.error("building VM cluster %s failed: removing what was created", spec.name)
        netns_cluster.down(spec.name)
        raise
    log.info("VM cluster %s: %d hosts up in %.1f s (%s)", spec.name, len(cluster.hosts),
             time.monotonic() - started, cluster.accel)
    return cluster


def _accel(vmlinuz: Path, initramfs: Path, workdir: Path) -> str:
    forced = os.environ.get("LOSSBED_VM_ACCEL")
    if forced in ("kvm", "tcg"):
        return forced
    cache = state.state_root() / ".vm-accel.json"
    try:
        cached = json.loads(cache.read_text())
        if cached.get("kernel") == str(vmlinuz):
            return cached["accel"]
    except (OSError, ValueError):
        pass
    accel = "kvm" if image.kvm_works(vmlinuz, initramfs, workdir) else "tcg"
    cache.write_text(json.dumps({"kernel": str(vmlinuz), "accel": accel}))
    return accel


def _mac(cluster: str, index: int) -> str:
    digest = hashlib.sha256(cluster.encode()).digest()
    return f"52:54:{digest[0]:02x}:{digest[1]:02x}:{index // 256:02x}:{index % 256:02x}"


def _qemu_argv(cluster: VMCluster, host: VMHost, index: int, vmlinuz: Path, initramfs: Path,
               tap: str) -> list[str]:
    d = cluster.state_dir
    no_offloads = ",".join(f"{feature}=off" for feature in (
        "csum", "gso", "guest_csum", "guest_tso4", "guest_tso6", "guest_ecn", "guest_ufo",
        "host_tso4", "host_tso6", "host_ecn", "host_ufo", "mrg_rxbuf"))
    # The guest runs this machine's own Python packages, built for its CPU: numpy 2 needs
    # x86-64-v2 (SSE4.2, POPCNT) at least, which qemu's default CPU model lacks (numpy
    # dies of SIGILL there). "max" is every feature TCG emulates; "host" is the real CPU.
    accel = (["-enable-kvm", "-cpu", "host"] if cluster.accel == "kvm"
             else ["-accel", "tcg", "-cpu", "max"])
    return [
        image.QEMU, *accel, "-m", str(cluster.memory_mb), "-smp", "1",
        "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
        "-daemonize", "-pidfile", str(d / f"{host.name}.pid"),
        "-serial", f"file:{d / f'{host.name}.console'}",
        "-kernel", str(vmlinuz), "-initrd", str(initramfs),
        "-append", "console=ttyS0 quiet panic=-1",
        "-virtfs", "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,"
                   "multidevs=remap",
        "-fw_cfg", f"name={image.FW_CFG_COMMAND},file={d / f'{host.name}.cmd'}",
        "-fw_cfg", f"name={image.FW_CFG_CONFIG},file={d / f'{host.name}.json'}",
        "-device", "virtio-serial-pci",
        "-chardev", f"socket,id=exec,path={host.channel},server=on,wait=off",
        "-device", "virtserialport,chardev=exec,name=lossbed.0",
        "-netdev", f"tap,id=net0,ifname={tap},script=no,downscript=no",
        "-device", f"virtio-net-pci,netdev=net0,mac={_mac(cluster.name, index)},"
                   f"host_mtu={cluster.mtu},{no_offloads}",
    ]


def _guest_config(cluster: VMCluster, host: VMHost) -> dict:
    cfg = {"name": host.name, "address": host.address, "prefixlen": cluster.subnet.prefixlen,
           "mtu": cluster.mtu, "hosts": {h.name: h.address for h in cluster.hosts},
           "rdma": cluster.rdma, "modules": []}
    if cluster.ssh:
        from testbed.clusters import sshd
        d = sshd.ssh_dir(cluster.state_dir)
        cfg["ssh"] = {"host_key": (d / "ssh_host_ed25519_key").read_text(),
                      "authorized_key": (d / "authorized_keys").read_text()}
    return cfg


def _build(cluster: VMCluster, guest) -> None:
    n = len(cluster.hosts)
    progress = Progress(f"up {cluster.name} (VMs)", total=2 * n + 1, show_after_s=0)
    d = cluster.state_dir
    initramfs = image.build_initramfs(guest, d / "initramfs.gz")
    cluster.accel = _accel(guest.image, initramfs, d)
    log.info("VM cluster %s: kernel %s, %s", cluster.name, cluster.kernel,
             "KVM" if cluster.accel == "kvm" else "TCG (software emulation; no working KVM)")
    state.write(cluster.name, cluster.record("building"))
    switch.create(cluster.name)
    if cluster.ssh:
        from testbed.clusters import sshd
        sshd.prepare(d, cluster.hosts)
    progress.advance("switch")
    taps = []
    for index, host in enumerate(cluster.hosts):
        tap = naming.switch_port_ifname(cluster.name, host.name)
        (d / f"{host.name}.json").write_text(json.dumps(_guest_config(cluster, host)))
        (d / f"{host.name}.cmd").write_text(
            f"cd {host.project} && PYTHONPATH={host.project} exec {host.python} "
            "-m testbed.clusters.vm.guest")
        argv = _qemu_argv(cluster, host, index, guest.image, initramfs, tap)
        # qemu starts inside the switch namespace: its tap device is born there.
        result = subprocess.run(["ip", "netns", "exec", cluster.switch_namespace, *argv],
                                capture_output=True, text=True)
        if result.returncode != 0:
            raise EnvironmentProblem(f"qemu did not start host {host.name}: "
                                     f"{result.stderr.strip()}")
        taps.append(tap)
        progress.advance("VMs started")
    switch.plug(cluster.name, taps, cluster.mtu)
    if cluster.ssh:
        _controller_namespace(cluster)
    with ThreadPoolExecutor(max_workers=n) as pool:
        infos = list(pool.map(lambda h: _wait_guest(cluster, h), cluster.hosts))
    for host, info in zip(cluster.hosts, infos, strict=True):
        problems = info.get("errors", [])
        if problems:
            raise EnvironmentProblem(f"host {host.name} came up with errors: {problems}")
        progress.advance("guests ready")
    progress.finish()


def _controller_namespace(cluster: VMCluster) -> None:
    """With --ssh: a namespace on the cluster's switch with the reserved controller address,
    from which SSH, `lossbed … --inventory` and Ansible reach the VMs (VMs have one NIC, so
    this is the data network; nothing is impaired while provisioning)."""
    from testbed.clusters import addressing, management
    from testbed.host import namespaces

    namespace = management.controller_namespace(cluster.name)
    namespaces.create(namespace)
    port = f"{cluster.name}-ctl"
    with namespaces.netlink(cluster.switch_namespace) as sw:
        sw.link("add", ifname=port, kind="veth", mtu=cluster.mtu,
                peer={"ifname": management.CONTROLLER_IFNAME, "net_ns_fd": namespace,
                      "mtu": cluster.mtu})
    switch.plug(cluster.name, [port], cluster.mtu)
    with namespaces.netlink(namespace) as ipr:
        ipr.link("set", index=ipr.link_lookup(ifname="lo")[0], state="up")
        index = ipr.link_lookup(ifname=management.CONTROLLER_IFNAME)[0]
        ipr.addr("add", index=index, address=addressing.controller_address(cluster.subnet),
                 prefixlen=cluster.subnet.prefixlen)
        ipr.link("set", index=index, state="up")


def _qemu_running(cluster: VMCluster, host: VMHost) -> bool:
    from testbed.host.hosts import is_running

    try:
        pid = int((cluster.state_dir / f"{host.name}.pid").read_text())
    except (FileNotFoundError, ValueError):
        return True  # not written yet
    return is_running(pid)


def _wait_guest(cluster: VMCluster, host: VMHost) -> dict:
    try:
        return channel.wait_ready(Path(host.channel), BOOT_TIMEOUT_S,
                                  alive=lambda: _qemu_running(cluster, host))
    except (TimeoutError, ClusterError, OSError):
        console = cluster.state_dir / f"{host.name}.console"
        tail = console.read_text(errors="replace")[-1500:] if console.exists() else "(none)"
        raise EnvironmentProblem(f"host {host.name} did not come up (within {BOOT_TIMEOUT_S} "
                                 f"s, or its VM stopped). Its console ends with:\n{tail}") from None
