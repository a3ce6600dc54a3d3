"""Every path a user types is read from the folder they typed it in, never from lossbed's
checkout (#66: `lossbed apply ... --inventory inv.yml --dry-run`, run from one's own folder,
planned to impair the hosts of a different inv.yml, the one in the checkout)."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from harness.cli import build_parser

CHECKOUT = Path(__file__).resolve().parents[2]

# SSH goes to loopback on a port nothing listens at (a dry run connects to probe the
# hosts' kernels): the host is refused at once, and the message names it
INVENTORY = """
all:
  vars:
    ansible_user: root
    ansible_port: 1
  hosts:
    {name}:
      ansible_host: {ssh}
      lossbed_interface: ens6
      lossbed_address: {address}
"""


@pytest.fixture
def decoy_name():
    """A file name that exists in the checkout (the decoy) for the length of one test."""
    name = f"lossbed-decoy-{uuid.uuid4().hex[:8]}.yml"
    decoy = CHECKOUT / name
    decoy.write_text(INVENTORY.format(name="decoy-host", ssh="127.0.0.66",
                                      address="127.0.66.66"))
    yield name
    decoy.unlink()


def lossbed(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness.cli", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)


def test_apply_dry_run_plans_the_hosts_of_the_users_inventory(tmp_path, decoy_name):
    """The dry run reaches for the hosts of the user's file (none is there: it is refused
    naming that host), never the checkout's."""
    (tmp_path / decoy_name).write_text(INVENTORY.format(name="my-host", ssh="127.0.0.65",
                                                        address="127.0.65.65"))
    done = lossbed(["apply", "clean", "--inventory", decoy_name, "--dry-run",
                    "--backend", "nft"], tmp_path)
    said = done.stdout + done.stderr
    assert done.returncode == 4, said
    assert "host my-host (root@127.0.0.65:1) is not reachable" in said, said
    assert "decoy" not in said and "127.0.0.66" not in said, said


def test_a_missing_inventory_is_named_with_the_users_folder(tmp_path, decoy_name):
    """Not found here means not found, even where the checkout holds a file of that name."""
    done = lossbed(["apply", "clean", "--inventory", decoy_name, "--dry-run"], tmp_path)
    said = done.stdout + done.stderr
    assert done.returncode == 2, said
    assert f"no inventory file {tmp_path / decoy_name}" in said, said
    assert "decoy-host" not in said


def test_an_unreadable_inventory_shows_why(tmp_path):
    """Where Ansible cannot read the file, its own warnings are in the message (the error
    used to point at "its warnings above", with none shown)."""
    (tmp_path / "inv.ini").write_text("[group\nhost ansible_host=\n")
    done = lossbed(["apply", "clean", "--inventory", "inv.ini", "--dry-run"], tmp_path)
    said = done.stdout + done.stderr
    assert done.returncode == 2, said
    assert "warnings above" not in said
    assert "Ansible said: [WARNING]: Failed to parse inventory with 'ini' plugin" in said, said


# Every option or argument that names a file or folder, per command: (the command line,
# the attribute it lands in). A name in the table that is not a path stays a name.
PATHS = [
    (["apply", "p.yaml", "--inventory", "inv.yml"], ["profile", "inventory"]),
    (["status", "--inventory", "inv.yml"], ["inventory"]),
    (["clear", "--inventory", "inv.yml"], ["inventory"]),
    (["show", "--inventory", "inv.yml"], ["inventory"]),
    (["verify", "--inventory", "inv.yml"], ["inventory"]),
    (["doctor", "--inventory", "inv.yml", "--profile", "p.yaml"], ["inventory", "profile"]),
    (["renew", "--inventory", "inv.yml"], ["inventory"]),
    (["train", "--inventory", "inv.yml", "--profile", "sub/p.yaml", "--corpus", "c.txt",
      "--out", "o", "--json", "r.jsonl", "--save-model", "m", "--preset", "./mine",
      "--tokenizer", "tok/", "--hf-dataset", "./ds"],
     ["inventory", "profile", "corpus", "out", "json", "save_model", "preset", "tokenizer",
      "hf_dataset"]),
    (["bench", "--inventory", "inv.yml", "--profile", "p.yml", "--out", "o",
      "--preset", "m/"], ["inventory", "profile", "out", "preset"]),
    (["run", "--inventory", "inv.yml", "--profile", "p.yaml", "--out", "o",
      "--workdir", "w", "--", "torchrun", "x.py"],
     ["inventory", "profile", "out", "workdir"]),
    (["report", "o"], ["dir"]),
    (["compare", "a", "b/summary.json"], ["base", "new"]),
    (["reproduce", "--out", "o"], ["out"]),
    (["collective-bench", "--json", "r.jsonl"], ["json"]),
    (["collective-bench", "--profiles", "mine.yaml", "x/p.yml"], ["profiles"]),
]


@pytest.mark.parametrize("argv,dests", PATHS, ids=[p[0][0] for p in PATHS])
def test_every_path_option_is_made_absolute_against_the_working_directory(
        tmp_path, monkeypatch, argv, dests):
    monkeypatch.chdir(tmp_path)
    args = build_parser().parse_args(argv)
    for dest in dests:
        value = getattr(args, dest)
        for one in value if isinstance(value, list) else [value]:
            assert os.path.isabs(one), (dest, one)
            assert Path(one).is_relative_to(tmp_path), (dest, one)


@pytest.mark.parametrize("argv,dest,name", [
    (["apply", "random-loss"], "profile", "random-loss"),
    (["train", "--profile", "burst-loss"], "profile", "burst-loss"),
    (["train", "--preset", "tiny"], "preset", "tiny"),
    (["train", "--tokenizer", "bpe:512"], "tokenizer", "bpe:512"),
])
def test_a_name_stays_a_name(tmp_path, monkeypatch, argv, dest, name):
    monkeypatch.chdir(tmp_path)
    assert getattr(build_parser().parse_args(argv), dest) == name


def test_every_file_option_of_every_command_is_a_users_path():
    """No option or argument that names a file or folder (by its metavar, or its
    destination) is taken as typed: a new one must choose user_path or user_name_or_path."""
    from testbed import checks

    parser = build_parser()
    commands = next(a for a in parser._actions if a.dest == "command").choices
    path_like = {"inventory", "out", "corpus", "save_model", "workdir", "dir", "base", "new",
                 "preset", "tokenizer", "hf_dataset", "profile", "profiles"}
    taken_as_typed = []
    for name, sub in commands.items():
        for action in sub._actions:
            names_a_file = action.metavar in ("FILE", "DIR") or action.dest in path_like
            if names_a_file and action.type not in (checks.user_path,
                                                    checks.user_name_or_path):
                taken_as_typed.append(f"{name} {action.option_strings or action.dest}")
    assert taken_as_typed == []
