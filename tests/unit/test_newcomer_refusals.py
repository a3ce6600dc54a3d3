"""The newcomer's edges (#57): options that were ignored, taken silently or refused late are
refused at once, with the option and the fix, before a cluster is touched or torch loads."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness import cli
from testbed import checks, clusters
from testbed.clusters import netns as netns_cluster
from testbed.clusters import state
from testbed.errors import ClusterError, UsageError

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def no_cluster_is_built(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a cluster was built for input that should have been refused")

    monkeypatch.setattr(netns_cluster, "up", refuse)


def _refused(argv, capsys) -> str:
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


def test_a_loss_written_as_a_percent_gets_the_fraction_it_means(capsys):
    with pytest.raises(SystemExit) as stop:
        cli.main(["bench", "--loss", "10%"])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "--loss" in err and "write 0.1 for 10%" in err, err
    with pytest.raises(SystemExit):
        cli.main(["train", "--loss", "ten"])
    assert "0.1 means 10%" in capsys.readouterr().err
    assert checks.loss_text(" 0.25 ") == 0.25


def test_apply_json_without_dry_run_is_refused_not_ignored(capsys):
    err = _refused(["apply", "random-loss", "--json", "--cluster", "nosuch"], capsys)
    assert "--json" in err and "--dry-run" in err, err


def test_doctor_set_without_a_profile_is_refused_not_ignored(capsys):
    err = _refused(["doctor", "--set", "loss=0.1", "--cluster", "nosuch"], capsys)
    assert "--set" in err and "--profile" in err, err


def test_a_loss_given_twice_is_refused_not_silently_one_of_them(capsys):
    err = _refused(["apply", "random-loss", "--loss", "0.1", "--set", "loss_pct=5",
                    "--cluster", "nosuch"], capsys)
    assert "loss_pct" in err and "--loss" in err, err


@pytest.mark.parametrize("argv,words", [
    (["collective-bench", "--json", "/nonexistent/dir/rows.jsonl"],
     ["--json", "/nonexistent/dir", "does not exist"]),
    (["train", "--cluster", "nosuch", "--json", "/nonexistent/x.jsonl"], ["--json"]),
    (["bench", "--out", "/etc/hostname/x"], ["--out", "is a file"]),
    (["bench", "--out", "/etc/hostname"], ["--out", "not a folder"]),
])
def test_a_path_that_cannot_be_written_is_refused_before_the_run(argv, words, capsys):
    err = _refused(argv, capsys)
    for word in words:
        assert word in err, (word, err)


def test_a_json_path_that_is_a_folder_is_refused(tmp_path, capsys):
    err = _refused(["collective-bench", "--json", str(tmp_path)], capsys)
    assert "is a folder" in err, err


def test_a_writable_path_passes_and_a_file_in_the_way_does_not(tmp_path):
    checks.writable_file("--json", str(tmp_path / "rows.jsonl"))
    checks.writable_folder("--out", str(tmp_path / "new" / "deeper"))
    (tmp_path / "f").write_text("")
    with pytest.raises(UsageError, match="--out"):
        checks.writable_folder("--out", str(tmp_path / "f" / "x"))


def test_a_cluster_that_is_not_up_names_those_that_are(tmp_path, monkeypatch):
    monkeypatch.setenv(state.STATE_ROOT_ENV, str(tmp_path))
    monkeypatch.setattr(netns_cluster, "leftover_clusters", lambda: set())
    with pytest.raises(ClusterError, match="none is: start one with lossbed up") as none:
        clusters.load("nosuch")
    assert "leftovers may exist" not in str(none.value)
    state.claim("alpha")
    state.write("alpha", {"status": "up"})
    with pytest.raises(ClusterError, match="clusters here: alpha"):
        clusters.load("nosuch")


# each refusal of a command that trains or benches, made before torch (and its ~2 s) loads
QUICK_REFUSALS = [
    ["train", "--cluster", "nosuch"],
    ["bench", "--cluster", "nosuch"],
    ["bench", "--loss", "2"],
    ["collective-bench", "--cluster", "nosuch"],
    ["collective-bench", "--json", "/nonexistent/dir/x"],
    ["compare", "/nonexistent/a", "/nonexistent/b"],
    ["run", "--cluster", "nosuch", "--", "torchrun", "x.py"],
    ["reproduce", "--rows", "99"],
    ["report", "/nonexistent/bench"],
]


def test_refusals_come_before_torch_is_imported(tmp_path):
    env = {**os.environ, state.STATE_ROOT_ENV: str(tmp_path), "PYTHONPATH": str(REPO)}
    program = "import sys; from harness.cli import main; sys.exit(main(sys.argv[1:]))"
    for argv in QUICK_REFUSALS:
        done = subprocess.run([sys.executable, "-X", "importtime", "-c", program, *argv],
                              cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode in (2, 4), (argv, done.returncode, done.stderr[-2000:])
        lines = done.stderr.splitlines()
        refusal = [line for line in lines if line.startswith("lossbed")]
        assert refusal and "Traceback" not in done.stderr, (argv, done.stderr[-2000:])
        imported = {line.split("|")[-1].strip() for line in lines if "import time:" in line}
        assert "torch" not in imported, (argv, refusal)


def test_lossbeds_options_after_the_double_dash_are_refused_not_passed_on(capsys):
    """`lossbed run -- torchrun train.py --cluster c1`: the script would get --cluster and
    lossbed would take the only cluster up, which may be another user's."""
    err = _refused(["run", "--", "torchrun", "train.py", "--cluster", "c1"], capsys)
    assert "given after --" in err and "lossbed run --cluster NAME -- " in err, err


def test_a_typo_in_the_number_of_hosts_is_refused_before_anything_is_built():
    with pytest.raises(UsageError, match="--hosts 64 or fewer"):
        netns_cluster.validate(netns_cluster.ClusterSpec(hosts=1000, name="t1"))


def test_an_unexpected_error_is_one_line_and_its_traceback_a_file(monkeypatch, capsys):
    from harness import cli as harness_cli

    def broken(args):
        raise KeyError("a bug of lossbed's (injected)")

    monkeypatch.setattr(harness_cli, "_cmd_report", broken)
    assert cli.main(["report", "somewhere"]) == 1
    err = capsys.readouterr().err
    assert "internal error: KeyError" in err and "Traceback" not in err, err
    log = err.split("the traceback is in ")[1].split(";")[0]
    assert "Traceback" in open(log).read()
    os.remove(log)
