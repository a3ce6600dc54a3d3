"""A cluster of real machines, from an Ansible inventory (the same file `ansible-playbook -i`
reads; YAML, or INI), e.g.:

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

Read by ansible-core itself (InventoryManager and VariableManager): groups named in several
places, hosts in several groups, host ranges (gpu[1:8]), and the group_vars/ and host_vars/
folders beside the file, with Ansible's precedence; tests/unit/test_inventory.py holds the
result against ansible-inventory --list. The Ansible
roles' own variables (lossbed_base_*, lossbed_kernel_*, ...) are left to Ansible; other keys
lossbed does not know are refused, with the close match.
"""

from __future__ import annotations

import difflib
import ipaddress
import json
import re
import subprocess
import sys
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


def _ip_address(value: str) -> str:
    """The ranks' address: one IPv4 or IPv6 address (not a network, not a name: ranks bind
    and are reached at it, and impairment matches on it)."""
    try:
        ipaddress.ip_address(value)
    except ValueError:
        raise ValueError(f"{value!r} is not an IP address: give the data-plane NIC's "
                         "address, e.g. 192.168.50.1") from None
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
    lossbed_address: Annotated[str, AfterValidator(_ip_address)]
    lossbed_project: str = "/opt/lossbed"
    lossbed_python: str | None = None
    lossbed_mtu: Annotated[int, Field(ge=68, le=65535)] = 1500
    lossbed_gpus: Annotated[int, Field(ge=0)] = 0
    lossbed_rdma_device: str | None = None
    lossbed_known_hosts: str | None = None

    @property
    def python(self) -> str:
        return self.lossbed_python or f"{self.lossbed_project}/.venv/bin/python"


# Variables of the Ansible roles in ansible/roles/ (each prefixed with its role's name):
# they configure provisioning, so lossbed leaves them to Ansible.
ROLE_PREFIXES = ("lossbed_base_", "lossbed_kernel_", "lossbed_nic_", "lossbed_rdma_",
                 "lossbed_verify_")


def _lossbed_view(variables: dict) -> dict:
    return {k: v for k, v in variables.items()
            if k in HostEntry.model_fields or not str(k).startswith(ROLE_PREFIXES)}


# What ansible-core's VariableManager adds to a host's variables on its own (the "magic"
# variables of 2.19): not the user's, so not checked against HostEntry
MAGIC_VARIABLES = frozenset({
    "ansible_config_file", "ansible_facts", "ansible_playbook_python", "ansible_version",
    "group_names", "groups", "inventory_dir", "inventory_file", "inventory_hostname",
    "inventory_hostname_short", "playbook_dir", "omit", "ansible_search_path"})
# Inventory plugins lossbed lets Ansible use: files only (Ansible would also run an
# executable inventory as a script)
PLUGINS = ["yaml", "ini"]


def _precheck(path: Path) -> None:
    """What ansible-core does not refuse on its own: a file too big, an alias bomb, a key
    given twice (testbed.yamlfile), and a YAML inventory that is not a mapping of groups."""
    try:
        data = yamlfile.read(path)
    except yamlfile.YamlInputError as err:
        if path.read_bytes()[:4096].lstrip().startswith(b"["):
            return  # an INI inventory ([group] lines): Ansible's ini plugin reads it
        raise UsageError("--inventory", f"{path}: {err}", "Fix the file") from None
    if not isinstance(data, dict):
        raise UsageError("--inventory", f"{path} is not a YAML inventory (a mapping of groups)",
                         "Start the file with all: (see ansible/inventory.example.yml), or "
                         "write an INI inventory ([group] lines)")
    # what load() would refuse after Ansible's second or so, refused from the file itself
    names = _yaml_host_names(data)
    if not names:
        raise UsageError("--inventory", f"{path} lists no hosts", "Add hosts under all.hosts")
    for name in names:
        if "[" not in name:  # (web[01:10] is a range Ansible expands)
            check_name(name, "host name")
    _precheck_host_variables(path, data)


def _precheck_host_variables(path: Path, groups: dict) -> None:
    """A host's own variable lossbed refuses, or a field nothing in the file sets: said
    from the file before Ansible's reading (a second or so in a process of its own). Only
    what Ansible cannot change: a host_vars/ folder beside the file may override a host's
    own values (then nothing is judged here), a group_vars/ folder may supply a missing
    field (then a missing one is left to Ansible); templated values and ranges are skipped."""
    if (path.parent / "host_vars").exists():
        return
    own: dict[str, dict] = {}
    set_by_groups: set = set()
    _collect_host_variables(groups, own, set_by_groups)
    may_be_supplied = (path.parent / "group_vars").exists()
    for name, values in own.items():
        view = _lossbed_view({k: v for k, v in values.items() if v is not _CONFLICT})
        try:
            HostEntry.model_validate(view)
        except ValidationError as err:
            sure = [e for e in err.errors() if (
                e["type"] == "missing" and not may_be_supplied
                and e["loc"][0] not in set_by_groups and e["loc"][0] not in values) or (
                e["type"] != "missing" and e["loc"] and e["loc"][0] in view)]
            if sure:
                raise UsageError("--inventory", f"{path}: host {name}: "
                                 + "; ".join(_explain(e) for e in sure),
                                 "Fix the host's variables") from None


_CONFLICT = object()  # a host listed twice with two values of one variable: Ansible's choice


def _collect_host_variables(groups: dict, own: dict, set_by_groups: set) -> None:
    """Each host's own variables (a host listed in several groups: all its entries), and the
    names of the variables any group sets (which may reach any host)."""
    for group in groups.values():
        if not isinstance(group, dict):
            continue
        if isinstance(group.get("vars"), dict):
            set_by_groups.update(group["vars"])
        hosts = group.get("hosts") if isinstance(group.get("hosts"), dict) else {}
        for name, values in hosts.items():
            if "[" in str(name):  # a range: Ansible expands it, to hosts named elsewhere too
                set_by_groups.update(values if isinstance(values, dict) else ())
                continue
            mine = own.setdefault(str(name), {})
            for key, value in (values.items() if isinstance(values, dict) else ()):
                templated = isinstance(value, str) and "{{" in value
                seen_other = key in mine and mine[key] != value
                mine[key] = _CONFLICT if templated or seen_other else value
        if isinstance(group.get("children"), dict):
            _collect_host_variables(group["children"], own, set_by_groups)


def _yaml_host_names(groups: dict) -> list:
    """The host names a YAML inventory declares: every group's hosts, its children's too."""
    names = []
    for group in groups.values():
        if isinstance(group, dict):
            if isinstance(group.get("hosts"), dict):
                names += list(group["hosts"])
            if isinstance(group.get("children"), dict):
                names += _yaml_host_names(group["children"])
    return names


def _ansible_hosts(path: Path) -> dict[str, dict]:
    """Every host of the inventory with its variables, read by ansible-core in a process of
    its own: importing ansible replaces sys.intern for the whole process, which breaks
    torch's compiler imported after it (torch._dynamo: "substitute_in_graph expects a
    function")."""
    # The child starts in the checkout (its imports), so it is given an absolute path: a
    # relative one would name the checkout's file of that name (#66)
    done = subprocess.run([sys.executable, "-m", "testbed.clusters.inventory",
                           str(path.absolute())],
                          capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).resolve().parents[2], stdin=subprocess.DEVNULL)
    try:
        answer = json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        raise UsageError("--inventory", f"{path}: reading it with Ansible failed: "
                         f"{done.stderr.strip()[-500:]}", "Check it with: ansible-inventory "
                         "-i FILE --list") from None
    if "error" in answer:
        field, problem, fix = answer["error"]
        warnings = _ansible_warnings(done.stderr)
        raise UsageError(field, problem + (f". Ansible said: {warnings}" if warnings else ""),
                         fix)
    return answer["hosts"]


def _ansible_warnings(stderr: str) -> str:
    """Ansible's own warnings about the file, on one line (the first 600 characters: the
    first warning says why)."""
    said = " ".join(line.strip() for line in stderr.splitlines() if line.strip())
    return said[:600]


def _ansible_hosts_here(path: Path) -> dict[str, dict]:
    """Every host of the inventory with its variables, as ansible-core's InventoryManager and
    VariableManager give them (group_vars/ and host_vars/ beside the file, ranges, groups
    named in several places, Ansible's precedence)."""
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader
    from ansible.vars.manager import VariableManager

    from ansible import constants

    enabled = constants.INVENTORY_ENABLED
    constants.INVENTORY_ENABLED = PLUGINS
    try:
        loader = DataLoader()
        parsed = InventoryManager(loader=loader, sources=[str(path)])
    finally:
        constants.INVENTORY_ENABLED = enabled
    if not parsed._inventory.processed_sources:
        raise UsageError("--inventory", f"{path}: Ansible could not read it as a YAML or INI "
                         "inventory",
                         "Check it with: ansible-inventory -i FILE --list")
    for group in parsed.groups:
        check_name(group, "group name")
    variables = VariableManager(loader=loader, inventory=parsed)
    hosts = {}
    for host in parsed.get_hosts():
        check_name(host.name, "host name")
        every = variables.get_vars(host=host, include_hostvars=False)
        hosts[host.name] = {k: v for k, v in every.items() if k not in MAGIC_VARIABLES}
    return hosts


def load(path: str | Path) -> dict[str, HostEntry]:
    path = Path(path).absolute()  # the user's folder's file, named so in every message
    if not path.is_file():
        raise UsageError("--inventory", f"no inventory file {path}",
                         "Give an Ansible inventory (YAML or INI)")
    _precheck(path)
    raw = {host: _lossbed_view(values) for host, values in _ansible_hosts(path).items()}
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


if __name__ == "__main__":  # _ansible_hosts' child: one JSON line, the hosts or the error
    try:
        print(json.dumps({"hosts": _ansible_hosts_here(Path(sys.argv[1]))}, default=str))
    except UsageError as err:
        print(json.dumps({"error": [err.field, err.problem, err.fix]}))
