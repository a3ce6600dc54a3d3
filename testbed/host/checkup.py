"""What one host has of what lossbed needs: the facts `lossbed doctor` judges (testbed/doctor/).

Runs on the host (the `checkup` agent operation: in this process for a namespace host, on the
machine itself for VM and remote hosts), reads and never changes anything but the probes'
own throwaway qdisc on loopback. Each fact is plain data, so a remote host's comes back as
JSON.
"""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from testbed.impair import coverage

COMMANDS = ("ip", "tc", "nft", "ethtool")
# kernel modules by the feature they give; a feature is there when its module is built in,
# loaded, or installed for the running kernel
MODULES = ("sch_netem", "ifb", "act_mirred", "act_gact", "cls_bpf", "nf_tables", "sch_htb",
           "rdma_rxe")
CAP_NET_ADMIN = 12



def interpreter_facts() -> dict:
    """What this Python has: its version, lossbed's compiled core, torch, CUDA, GPUs, NCCL."""
    facts: dict = {"executable": sys.executable, "version": platform.python_version()}
    try:
        facts["core"] = compiled_core()
    except Exception as err:
        facts["core_error"] = f"{type(err).__name__}: {err}"
    try:
        import torch
    except Exception as err:
        facts["torch_error"] = f"{type(err).__name__}: {err}"
        return facts
    facts["torch"] = torch.__version__
    facts["cuda_build"] = torch.version.cuda
    facts["cuda_available"] = bool(torch.cuda.is_available())
    count = torch.cuda.device_count() if facts["cuda_available"] else 0
    facts["gpus"] = [torch.cuda.get_device_name(i) for i in range(count)]
    try:
        facts["nccl"] = ".".join(map(str, torch.cuda.nccl.version())) if count else None
    except Exception:  # a build without NCCL
        facts["nccl"] = None
    return facts


def compiled_core() -> str:
    """The path of the data plane's compiled core built for this Python, once it has loaded
    (its libcrypto linked). Found beside the training side's package without importing it
    (the network side never imports harness), and loaded in a child process of this Python,
    so this process never holds a second copy of it under another name."""
    loaded = sys.modules.get("harness.transport._wire")
    if loaded is not None:
        return loaded.__file__
    spec = importlib.util.find_spec("harness")  # a top-level package: nothing is imported
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("lossbed's harness package is not on this Python's path")
    folder = Path(next(iter(spec.submodule_search_locations))) / "transport"
    path = folder / f"_wire{sysconfig.get_config_var('EXT_SUFFIX')}"
    if not path.exists():
        raise FileNotFoundError(f"no {path.name} in {folder}: the core is not built for "
                                f"Python {platform.python_version()}")
    loaded = subprocess.run([sys.executable, "-c", _LOAD_EXTENSION, str(path)],
                            capture_output=True, text=True, timeout=60)
    if loaded.returncode != 0:
        raise ImportError(f"{path.name} does not load: "
                          f"{(loaded.stderr.strip().splitlines() or ['?'])[-1]}")
    return str(path)


_LOAD_EXTENSION = (
    "import importlib.machinery as m, importlib.util as u, sys; "
    "loader = m.ExtensionFileLoader('_wire', sys.argv[1]); "
    "loader.exec_module(u.module_from_spec(u.spec_from_loader('_wire', loader)))")


def module_state(name: str, release: str | None = None, root: Path = Path("/")) -> str | None:
    """'loaded', 'built-in', 'installed' (loadable with modprobe), or None (absent); 'unknown'
    where the kernel's module lists are not readable (a container without /lib/modules)."""
    if (root / "sys" / "module" / name).exists():
        return "loaded"
    folder = root / "lib" / "modules" / (release or platform.release())
    if not folder.is_dir():
        return "unknown"
    names = {name, name.replace("_", "-")}

    def listed(file: str) -> bool:
        try:
            text = (folder / file).read_text()
        except OSError:
            return False
        for line in text.splitlines():
            module = line.split(":", 1)[0].rsplit("/", 1)[-1].split(".ko", 1)[0]
            if module in names:
                return True
        return False

    if listed("modules.builtin"):
        return "built-in"
    if listed("modules.dep"):
        return "installed"
    return None


def effective_capabilities(status_text: str) -> int:
    for line in status_text.splitlines():
        if line.startswith("CapEff:"):
            return int(line.split()[1], 16)
    return 0


def nic(host, carried: dict) -> dict:
    """The interface lossbed impairs on this host: MTU, speed, merging offloads still on,
    and (carried: the `check` operation's answer, or {"error": why}) whether it carries the
    default route or the SSH session."""
    facts: dict = {"name": host.ifname}
    if "error" in carried:
        facts["error"] = carried["error"]
        return facts
    for key in ("carries_default_route", "carries_ssh_session", "addresses"):
        facts[key] = carried[key]
    for key, file in (("mtu", "mtu"), ("speed_mbit", "speed")):
        read = host.run(["cat", f"/sys/class/net/{host.ifname}/{file}"])
        value = read.stdout.decode().strip() if read.returncode == 0 else ""
        facts[key] = int(value) if value.lstrip("-").isdigit() else None
    try:
        offloads = host.offloads()
        facts["offloads_on"] = sorted(name for name, on in offloads.items() if on)
    except Exception as err:
        facts["offloads_on"] = None
        facts["offloads_error"] = str(err)
    return facts


# What a rank of a lossy job imports once it joins (its transport, collective and
# optimizers), as a line of code for the ranks' Python to run: harness.api alone imports
# neither numpy nor torch, so it would pass a Python that every rank then dies in
RANK_IMPORTS = ("    import harness.api, harness.transport.udp, harness.collectives.lossy, "
                "harness.ddp.hooks, harness.ddp.sharded, harness.ddp.rps")


def python_facts(python: str, project: str, timeout_s: float = 120.0) -> dict:
    """interpreter_facts() of the ranks' Python: in this process when it is this Python with
    this project, else in that Python with the project on its PYTHONPATH."""
    here = str(Path(__file__).resolve().parents[2])
    if Path(python).resolve() == Path(sys.executable).resolve() and project in ("", here):
        return interpreter_facts()
    # ... and whether it imports what a lossy rank imports (RANK_IMPORTS: numpy, torch and
    # lossbed's other packages), in that Python alone: the network side never imports it
    code = ("import json\nfrom testbed.host.checkup import interpreter_facts\n"
            "facts = interpreter_facts()\ntry:\n" + RANK_IMPORTS + "\n"
            "except Exception as err:\n"
            "    facts['api_error'] = f'{type(err).__name__}: {err}'\n"
            "print(json.dumps(facts))")
    try:
        ran = subprocess.run([python, "-c", code], capture_output=True, text=True,
                             timeout=timeout_s, env={**os.environ, "PYTHONPATH": project},
                             cwd=project or None)
    except (OSError, subprocess.TimeoutExpired) as err:
        return {"executable": python, "error": str(err)}
    if ran.returncode != 0:
        return {"executable": python, "error": (ran.stderr.strip() or "failed")[-500:]}
    return json.loads(ran.stdout.splitlines()[-1])


def gpu_driver() -> str | None:
    if shutil.which("nvidia-smi") is None:
        return None
    ran = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True)
    lines = ran.stdout.split()
    return lines[0] if ran.returncode == 0 and lines else None


def rdma_devices() -> list[str]:
    folder = Path("/sys/class/infiniband")
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


def other_interfaces(host) -> dict[str, list[str]]:
    """Every addressed, non-loopback interface but the impaired one: name -> its IPv4
    networks as address/prefix (a second way to the peers is a way around the impairment)."""
    import socket

    found: dict[str, list[str]] = {}
    with host.netlink() as ipr:
        names = {link["index"]: link.get_attr("IFLA_IFNAME") for link in ipr.get_links()
                 if not link["flags"] & 0x8}  # IFF_LOOPBACK
        for a in ipr.get_addr(family=socket.AF_INET):
            name = names.get(a["index"])
            if name and name != host.ifname:
                found.setdefault(name, []).append(
                    f"{a.get_attr('IFA_ADDRESS')}/{a['prefixlen']}")
    return found


def examine(host, payload: dict, backends: dict, carried: dict) -> dict:
    """Every fact about this host; payload: python (the ranks' interpreter), project (its
    PYTHONPATH), and python_facts (false: skip the interpreter, e.g. already examined on
    this machine). backends and carried: the `probe` and `check` operations' answers."""
    status = host.run(["cat", "/proc/self/status"])
    facts = {
        "host": host.name,
        "kernel": platform.release(),
        "commands": {name: shutil.which(name) for name in COMMANDS},
        "modules": {name: module_state(name) for name in MODULES},
        "namespaces": os.path.exists("/proc/self/ns/net"),
        "cap_net_admin": bool(effective_capabilities(status.stdout.decode())
                              & (1 << CAP_NET_ADMIN)) if status.returncode == 0 else False,
        "backends": backends,
        "nic": nic(host, carried),
        "rdma_devices": rdma_devices(),
        # what could carry a job around the impaired interface (judged by doctor)
        "hardware_rdma": coverage.rdma_devices(),
        "other_interfaces": other_interfaces(host),
        "gpu_driver": gpu_driver(),
    }
    if payload.get("python_facts", True):
        facts["python"] = python_facts(payload.get("python") or sys.executable,
                                       payload.get("project") or "")
    return facts
