"""A cluster of real machines, from an inventory in Ansible's YAML format (the same file
`ansible-playbook -i` reads):

    all:
      vars:
        ansible_user: root
        ansible_ssh_private_key_file: ~/.ssh/lossbed
        lossbed_project: /opt/lossbed          # the checkout on the hosts
        lossbed_python: /opt/lossbed/.venv/bin/python
        lossbed_mtu: 9000
      hosts:
        gpu1:
          ansible_host: 10.10.0.1              # where SSH goes (management network)
          lossbed_interface: ens6              # the data-plane NIC lossbed impairs
          lossbed_address: 192.168.50.1        # its address (ranks talk over it)
          lossbed_gpus: 8
          lossbed_rdma_device: mlx5_0

Host variables override group and `all` variables. Keys lossbed does not know are refused
(with the close match), except other ansible_* connection settings.
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from testbed import yamlfile
from testbed.errors import UsageError

# Host and group names reach paths on the hosts (lease files) and on the controller: letters,
# digits, '.', '-' and '_', starting with a letter or digit, at most 63 (a DNS label's limit)
# -- what real inventories use (dgx-01.lab, rack_2), and never a path ('/', '..', '.x').
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
NAME_RULE = ("1 to 63 letters, digits, '.', '-' and '_', starting with a letter or digit, "
             "without '..'")
# Linux interface names: 1-15 bytes, no '/', no whitespace, not '.' or '..' (dev_valid_name)
_IFNAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:@-]{0,14}")


def check_name(name, what: str) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name) or ".." in name:
        raise UsageError("--inventory", f"{what} {name!r} is not usable: a {what} is "
                         f"{NAME_RULE}", f"Rename the {what}")
    return name


def _interface_name(value: str) -> str:
    if not _IFNAME.fullmatch(value) or ".." in value or len(value.encode()) > 15:
        raise ValueError(f"{value!r} is not a Linux interface name (1-15 characters of "
                         "letters, digits, '_', '.', ':', '@', '-'; no '/')")
    return value


class HostEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")

    ansible_host: str
    ansible_port: Annotated[int, Field(ge=1, le=65535)] = 22
    ansible_user: str = "root"
    ansible_ssh_private_key_file: str | None = None
    ansible_python_interpreter: str | None = None
    ansible_become: bool | None = None
    ansible_become_user: str | None = None
    ansible_connection: str | None = None
    ansible_ssh_common_args: str | None = None
    lossbed_interface: Annotated[str, AfterValidator(_interface_name)]
    lossbed_address: str
    lossbed_project: str = "/opt/lossbed"
    lossbed_python: str | None = None
    lossbed_mtu: Annotated[int, Field(ge=68, le=65535)] = 1500
    lossbed_gpus: Annotated[int, Field(ge=0)] = 0
    lossbed_rdma_device: str | None = None
    lossbed_known_hosts: str | None = None

    @property
    def python(self) -> str:
        return self.lossbed_python or f"{self.lossbed_project}/.venv/bin/python"


def _walk(group: dict, inherited: dict, out: dict, where: str) -> None:
    if not isinstance(group, dict):
        raise UsageError("inventory", f"{where} must be a mapping",
                         "See ansible/inventory.example.yml")
    variables = {**inherited, **(group.get("vars") or {})}
    for name, host_vars in (group.get("hosts") or {}).items():
        check_name(name, "host name")
        merged = {**variables, **(host_vars or {})}
        if name in out and out[name] != merged:
            raise UsageError("inventory", f"host {name!r} appears twice with different "
                             "settings", "Define each host once")
        out[name] = merged
    for child, sub in (group.get("children") or {}).items():
        check_name(child, "group name")
        _walk(sub or {}, variables, out, f"{where}.children.{child}")
    unknown = set(group) - {"vars", "hosts", "children"}
    if unknown:
        raise UsageError("inventory", f"{where} has unknown key(s) {', '.join(sorted(unknown))}",
                         "A group has only vars, hosts and children")


def load(path: str | Path) -> dict[str, HostEntry]:
    path = Path(path)
    if not path.is_file():
        raise UsageError("--inventory", f"no inventory file {path}", "Give a YAML inventory")
    try:
        data = yamlfile.read(path)
    except yamlfile.YamlInputError as err:
        raise UsageError("--inventory", f"{path}: {err}", "Fix the file") from None
    if not isinstance(data, dict) or "all" not in data:
        raise UsageError("--inventory", f"{path} has no top-level 'all' group",
                         "Start the file with all: (see ansible/inventory.example.yml)")
    raw: dict[str, dict] = {}
    _walk(data["all"], {}, raw, "all")
    if not raw:
        raise UsageError("--inventory", f"{path} lists no hosts", "Add hosts under all.hosts")
    hosts = {}
    for name, values in raw.items():
        try:
            hosts[name] = HostEntry.model_validate(values)
        except ValidationError as err:
            raise UsageError("--inventory", f"{path}: host {name}: "
                             + "; ".join(_explain(e) for e in err.errors()),
                             "Fix the host's variables") from None
    endpoints = {}
    for name, h in hosts.items():
        for key in ((h.ansible_host, h.ansible_port), h.lossbed_address):
            if key in endpoints:
                raise UsageError("--inventory", f"hosts {endpoints[key]} and {name} share "
                                 f"{key}", "Each host needs its own address")
            endpoints[key] = name
    return hosts


def _explain(error: dict) -> str:
    field = ".".join(str(x) for x in error["loc"])
    if error["type"] == "extra_forbidden":
        close = difflib.get_close_matches(field, list(HostEntry.model_fields), n=1)
        return f"unknown key {field!r}" + (f" (did you mean {close[0]}?)" if close else "")
    if error["type"] == "missing":
        hint = {"lossbed_interface": "the data-plane NIC to impair, e.g. ens6",
                "lossbed_address": "that NIC's address",
                "ansible_host": "where SSH reaches the host"}.get(field, "")
        return f"{field} is missing" + (f" ({hint})" if hint else "")
    return f"{field}: {error['msg']}"
