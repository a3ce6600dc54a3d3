"""Names are never paths: every command that takes a cluster name refuses one that is not a
cluster name (exit 2, the rule in the message) before touching anything, and the state
module on its own never removes a folder outside its root. No root needed: nothing here may
reach the kernel.

The state root is a temporary folder with a sibling "victim" folder; a safety net refuses
any rmtree outside the test's own folder, so even broken code cannot damage this machine
while the test finds it out."""

from __future__ import annotations

import shutil

import pytest

from harness import cli
from testbed.clusters import inventory, naming, state
from testbed.errors import UsageError
from testbed.host import lease

BAD_NAMES = ["../victim", "..", "/", "a/b", ".hidden", "", "x" * 4096, "Up", "a-b", "é"]

COMMANDS = {
    "down": lambda n: ["down", n],
    "status": lambda n: ["status", n],
    "exec": lambda n: ["exec", "--cluster", n, "h1", "--", "true"],
    "apply": lambda n: ["apply", "clean", "--cluster", n],
    "show": lambda n: ["show", "--cluster", n],
    "clear": lambda n: ["clear", "--cluster", n],
    "verify": lambda n: ["verify", "--cluster", n],
    "train": lambda n: ["train", "--cluster", n, "--steps", "1"],
    "bench": lambda n: ["bench", "--cluster", n, "--steps", "1", "--seeds", "1"],
    "collective-bench": lambda n: ["collective-bench", "--cluster", n, "--iters", "1"],
    "inventory": lambda n: ["inventory", "--cluster", n],
    "up": lambda n: ["up", "--hosts", "1", "--name", n],
}


@pytest.fixture
def sandbox(tmp_path, monkeypatch):
    """A state root with a sibling victim folder; rmtree outside tmp_path is refused."""
    root = tmp_path / "state"
    victim = tmp_path / "victim"
    root.mkdir()
    victim.mkdir()
    (victim / "precious").write_text("keep me")
    monkeypatch.setenv(state.STATE_ROOT_ENV, str(root))
    real_rmtree = shutil.rmtree
    escaped = []

    def guarded_rmtree(path, *args, **kwargs):
        resolved = str(shutil.os.path.realpath(path))
        if not resolved.startswith(str(tmp_path.resolve()) + "/"):
            escaped.append(resolved)
            raise AssertionError(f"rmtree outside the test's folder: {resolved}")
        return real_rmtree(path, *args, **kwargs)

    monkeypatch.setattr(shutil, "rmtree", guarded_rmtree)
    yield root, victim, escaped
    assert escaped == [], f"something tried to remove {escaped}"
    assert (victim / "precious").read_text() == "keep me"


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_command_refuses_a_name_that_is_not_a_cluster_name(command, sandbox, capsys):
    root, victim, _ = sandbox
    for name in BAD_NAMES:
        rc = cli.main(COMMANDS[command](name))
        err = capsys.readouterr().err
        assert rc == 2, (command, name, err)
        assert "lower-case letters and digits" in err, (command, name, err)
        assert "Traceback" not in err
        assert victim.exists() and (victim / "precious").exists(), (command, name)
        assert list(root.iterdir()) == [], (command, name)  # nothing was made either


def test_a_good_name_passes_the_rule():
    for good in ("local", "demo", "a1", "bench12345"):
        naming.check_cluster_name(good)


def test_the_state_module_on_its_own_never_leaves_its_root(sandbox, tmp_path):
    root, victim, _ = sandbox
    (root / "ok").mkdir()
    for name in ("../victim", "..", "/", "", ".", "ok/../../victim"):
        with pytest.raises(UsageError, match="outside lossbed's state folder|not a folder"):
            state.forget(name)
        with pytest.raises(UsageError):
            state.claim(name)
    # a folder in the root that is a link to somewhere else is not removed through the link
    (root / "link").symlink_to(victim, target_is_directory=True)
    with pytest.raises(UsageError, match="outside lossbed's state folder"):
        state.forget("link")
    assert (victim / "precious").exists()
    state.forget("ok")  # a real cluster folder inside the root still goes
    assert not (root / "ok").exists()


INVENTORY = """
all:
  hosts:
    {host}:
      ansible_host: 10.0.0.1
      lossbed_interface: {ifname}
      lossbed_address: 192.168.50.1
  children:
    {group}:
      hosts: {{}}
"""


@pytest.mark.parametrize("host,ifname,group,field", [
    ("../../etc/x", "ens6", "rack", "host name"),
    ("a/b", "ens6", "rack", "host name"),
    (".hidden", "ens6", "rack", "host name"),
    ("gpu1", "../x", "rack", "lossbed_interface"),
    ("gpu1", "a/b", "rack", "lossbed_interface"),
    ("gpu1", "waytoolonginterface", "rack", "lossbed_interface"),
    ("gpu1", "ens6", "../up", "group name"),
    ("gpu1", "ens6", "a/b", "group name"),
])
def test_inventory_names_that_would_be_paths_are_refused(tmp_path, host, ifname, group, field):
    path = tmp_path / "inv.yml"
    path.write_text(INVENTORY.format(host=f'"{host}"', ifname=f'"{ifname}"',
                                     group=f'"{group}"'))
    with pytest.raises(UsageError, match=field):
        inventory.load(path)


def test_inventory_names_real_clusters_use_are_accepted(tmp_path):
    path = tmp_path / "inv.yml"
    path.write_text(INVENTORY.format(host="dgx-01.lab", ifname="enp65s0f0np0", group="rack_2"))
    assert list(inventory.load(path)) == ["dgx-01.lab"]


def test_a_lease_file_is_never_named_outside_the_lease_folder():
    for host, ifname in (("../x", "eth0"), ("h1", "../../etc/passwd"), ("a/b", "eth0"),
                         ("", "eth0"), ("h1", "")):
        with pytest.raises(UsageError):
            lease.lease_file(host, ifname)
    assert lease.lease_file("dgx-01.lab", "ens6").parent == lease.LEASE_DIR
