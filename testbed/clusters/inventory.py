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

Read as Ansible reads it (tests/unit/test_inventory.py holds it against ansible-inventory):
groups named in several places, hosts in several groups, host ranges (gpu[1:8]), and the
group_vars/ and host_vars/ folders beside the file, with Ansible's precedence. The Ansible
roles' own variables (lossbed_base_*, lossbed_kernel_*, ...) are left to Ansible; other keys
lossbed does not know are refused, with the close match.
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


_RANGE = re.compile(r"\[([0-9]+|[a-z]):([0-9]+|[a-z])(?::([0-9]+))?\]")


def expand_hosts(pattern: str) -> list[str]:
    """Ansible's host ranges: gpu[1:4] is gpu1..gpu4, node[01:10] keeps the zeros,
    r[a:c] is ra..rc, [0:8:2] takes every second; several ranges in one name multiply."""
    found = _RANGE.search(pattern) if isinstance(pattern, str) else None
    if not found:
        return [pattern]
    first, last, stride = found.group(1), found.group(2), int(found.group(3) or 1)
    if first.isdigit() != last.isdigit() or stride < 1:
        raise UsageError("--inventory", f"host range {found.group(0)!r} in {pattern!r} is "
                         "not one Ansible reads", "Write e.g. gpu[1:8] or node[01:16]")
    if first.isdigit():
        width = len(first) if first.startswith("0") and len(first) > 1 else 0
        values = [str(i).zfill(width) for i in range(int(first), int(last) + 1, stride)]
    else:
        values = [chr(c) for c in range(ord(first), ord(last) + 1, stride)]
    if not values:
        raise UsageError("--inventory", f"host range {found.group(0)!r} in {pattern!r} is "
                         "empty", "Give the smaller bound first")
    head, tail = pattern[:found.start()], pattern[found.end():]
    return [name for v in values for name in expand_hosts(head + v + tail)]


class _Inventory:
    """Groups and hosts as Ansible's YAML inventory plugin reads them: a group named in
    several places is one group (its vars merged); a host named in several groups is one
    host in all of them (its vars merged)."""

    def __init__(self):
        self.group_vars: dict[str, dict] = {"all": {}}
        self.parents: dict[str, set[str]] = {"all": set()}
        self.host_vars: dict[str, dict] = {}
        self.host_groups: dict[str, set[str]] = {}

    def group(self, name: str, body, parent: str | None, where: str) -> None:
        if body is None:
            body = {}
        if not isinstance(body, dict):
            raise UsageError("inventory", f"{where} must be a mapping",
                             "See ansible/inventory.example.yml")
        unknown = set(body) - {"vars", "hosts", "children"}
        if unknown:
            raise UsageError("inventory", f"{where} has unknown key(s) "
                             f"{', '.join(sorted(map(str, unknown)))}",
                             "A group has only vars, hosts and children")
        self.group_vars.setdefault(name, {}).update(body.get("vars") or {})
        self.parents.setdefault(name, set())
        if parent is not None:
            self.parents[name].add(parent)
        for pattern, host_vars in (body.get("hosts") or {}).items():
            for host in expand_hosts(pattern):
                check_name(host, "host name")
                if host_vars is not None and not isinstance(host_vars, dict):
                    raise UsageError("inventory", f"{where}.hosts.{host} must be a mapping",
                                     "Give the host's variables as key: value lines")
                self.host_vars.setdefault(host, {}).update(host_vars or {})
                self.host_groups.setdefault(host, set()).add(name)
        for child, sub in (body.get("children") or {}).items():
            check_name(child, "group name")
            self.group(child, sub, name, f"{where}.children.{child}")

    def depth(self, name: str, seen: tuple = ()) -> int:
        if name in seen:
            raise UsageError("inventory", f"group {name!r} is its own ancestor",
                             "Remove the loop from the children")
        parents = self.parents.get(name) or set()
        if name == "all" or not parents:
            return 0 if name == "all" else 1
        return 1 + max(self.depth(p, (*seen, name)) for p in parents)

    def ancestors(self, name: str) -> set[str]:
        out = {name, "all"}
        for parent in self.parents.get(name) or ():
            out |= self.ancestors(parent)
        return out

    def variables(self, host: str, beside: Path) -> dict:
        """A host's variables in Ansible's order (checked against ansible-inventory): the
        inventory file's group vars from the shallowest group to the deepest (by name
        within a depth), then group_vars/all, then group_vars/ of the other groups in the
        same order, then the file's host vars, then host_vars/ of the host. `beside`: the
        inventory's folder, where group_vars/ and host_vars/ are looked for."""
        groups = set().union(*(self.ancestors(g) for g in self.host_groups[host]))
        ordered = sorted(groups, key=lambda g: (self.depth(g), g))
        merged = {}
        for name in ordered:
            merged.update(self.group_vars.get(name) or {})
        for name in ordered:  # "all" first: it is the shallowest
            merged.update(_vars_from(beside / "group_vars", name))
        merged.update(self.host_vars[host])
        merged.update(_vars_from(beside / "host_vars", host))
        return merged


def _vars_files(folder: Path, name: str) -> list[Path]:
    """What Ansible reads for a group or host in group_vars/ or host_vars/: NAME, NAME.yml,
    NAME.yaml, NAME.json, or every such file in a folder NAME/ (in name order)."""
    found = [folder / f"{name}{ext}" for ext in ("", ".yml", ".yaml", ".json")
             if (folder / f"{name}{ext}").is_file()]
    if (folder / name).is_dir():
        found += sorted(f for f in (folder / name).iterdir()
                        if f.is_file() and f.suffix in ("", ".yml", ".yaml", ".json"))
    return found


def _vars_from(folder: Path, name: str) -> dict:
    merged = {}
    for path in _vars_files(folder, name):
        try:
            data = yamlfile.read(path)
        except yamlfile.YamlInputError as err:
            raise UsageError("--inventory", f"{path}: {err}", "Fix the file") from None
        if data is None:
            continue
        if not isinstance(data, dict):
            raise UsageError("--inventory", f"{path} is not a mapping of variables",
                             "Write key: value lines")
        merged.update(data)
    return merged


# Variables of the Ansible roles in ansible/roles/ (each prefixed with its role's name):
# they configure provisioning, so lossbed leaves them to Ansible.
ROLE_PREFIXES = ("lossbed_base_", "lossbed_kernel_", "lossbed_nic_", "lossbed_rdma_",
                 "lossbed_verify_")


def _lossbed_view(variables: dict) -> dict:
    return {k: v for k, v in variables.items()
            if k in HostEntry.model_fields or not str(k).startswith(ROLE_PREFIXES)}


def load(path: str | Path) -> dict[str, HostEntry]:
    path = Path(path)
    if not path.is_file():
        raise UsageError("--inventory", f"no inventory file {path}", "Give a YAML inventory")
    try:
        data = yamlfile.read(path)
    except yamlfile.YamlInputError as err:
        ini = path.read_bytes()[:4096].lstrip().startswith(b"[")
        raise UsageError("--inventory", f"{path}: {err}",
                         "lossbed reads YAML inventories; convert an INI one with: "
                         "ansible-inventory -i FILE --list -y" if ini else "Fix the file") \
            from None
    if not isinstance(data, dict):
        raise UsageError("--inventory", f"{path} is not a YAML inventory (a mapping of groups)",
                         "Start the file with all: (see ansible/inventory.example.yml); an "
                         "INI inventory converts with: ansible-inventory -i FILE --list -y")
    parsed = _Inventory()
    for name, body in data.items():  # top-level keys are groups: all, or children of all
        check_name(name, "group name")
        parsed.group(name, body, None if name == "all" else "all", name)
    raw = {host: _lossbed_view(parsed.variables(host, path.parent))
           for host in parsed.host_vars}
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
