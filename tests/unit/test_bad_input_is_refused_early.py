"""Bad input is refused before work starts: exit 2 with the option and the fix, and no
cluster built, nothing applied, no rank launched. No root needed: each refusal must come
before anything that would need it."""

from __future__ import annotations

import pytest

from harness import cli
from testbed.clusters import netns as netns_cluster
from testbed.host import lease


@pytest.fixture(autouse=True)
def no_cluster_is_built(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a cluster was built for input that should have been refused")

    monkeypatch.setattr(netns_cluster, "up", refuse)


@pytest.mark.parametrize("argv,words", [
    (["collective-bench", "--profiles", "nosuch"], ["PROFILE", "no profile named 'nosuch'"]),
    (["collective-bench", "--hosts", "1"], ["--hosts", "2 or more"]),
    (["collective-bench", "--loss", "0.1", "--profiles", "random-loss", "--sizes", "0"],
     ["--sizes"]),
    (["collective-bench", "--align-every", "-1"], ["--align-every", "0 or more"]),
    # nan passed `size <= 0` and 4 hosts came up, then "internal error" (#68)
    (["collective-bench", "--sizes", "nan"], ["--sizes", "nan is not a size"]),
    (["collective-bench", "--sizes", "1", "inf"], ["--sizes", "inf is not a size"]),
    (["train", "--cluster", "nosuch", "--eval-tokens", "-1"], ["--eval-tokens", "negative"]),
    (["train", "--cluster", "nosuch", "--seed", "-3"], ["--seed", "negative"]),
    (["train", "--cluster", "nosuch", "--lr", "nan"], ["--lr"]),
    (["train", "--inventory", "x.yml", "--lease-s", "0"], ["--lease-s", "positive"]),
    (["apply", "clean", "--inventory", "x.yml", "--lease-s", "-5"], ["--lease-s"]),
    (["run", "--inventory", "x.yml", "--lease-s", "nan", "--", "torchrun", "x.py"],
     ["--lease-s"]),
    (["bench", "--hosts", "1"], ["--hosts"]),
    (["bench", "--loss", "10"], ["--loss", "fraction"]),
])
def test_bad_options_are_refused_before_anything_is_built(argv, words, capsys):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    for word in words:
        assert word in err, (word, err)
    assert "Traceback" not in err


@pytest.mark.parametrize("command", [
    ["train", "--cluster", "nosuch"], ["bench", "--hosts", "2"],
    ["collective-bench", "--hosts", "2"]])
@pytest.mark.parametrize("value", ["7", "x:0.1", "7:1.5", "7:abc", "-1:0.1"])
def test_a_bad_drop_mask_is_refused_on_the_controller(monkeypatch, capsys, command, value):
    monkeypatch.setenv("LOSSBED_DROP_MASK", value)
    assert cli.main(command) == 2
    err = capsys.readouterr().err
    assert "LOSSBED_DROP_MASK" in err and "SEED:RATE" in err, err


def test_an_unknown_reliable_backend_is_refused_on_the_controller(monkeypatch, capsys):
    monkeypatch.setenv("LOSSBED_BACKEND", "mpi")
    assert cli.main(["train", "--cluster", "nosuch"]) == 2
    assert "LOSSBED_BACKEND" in capsys.readouterr().err


def test_the_lease_watchdog_keeps_a_lease_whose_clear_failed_and_retries(tmp_path):
    path = tmp_path / "h1-eth0.lease"
    path.write_text("0.01\n")
    attempts = []

    def clear():
        attempts.append(lease.error_file(path).exists())
        if len(attempts) < 3:
            assert path.exists()  # the lease is still there while clearing fails
            raise OSError("netlink busy (injected)")

    assert lease.watch(path, "eth0", clear, retry_max_s=0.01) == "expired"
    # the first attempt found no error file; the next ones found the first failure reported
    assert attempts == [False, True, True]
    assert not path.exists() and not lease.error_file(path).exists()


def test_a_failed_clear_is_reported_beside_the_lease(tmp_path, monkeypatch):
    monkeypatch.setattr(lease, "LEASE_DIR", tmp_path)
    path = lease.lease_file("h1", "eth0")
    path.write_text("0.01\n")
    seen = []

    def clear():
        seen.append(lease.failure("h1", "eth0"))
        if len(seen) < 2:
            raise OSError("nft: table busy (injected)")

    lease.watch(path, "eth0", clear, retry_max_s=0.01)
    assert seen[0] is None and "nft: table busy (injected)" in seen[1]
    assert lease.failure("h1", "eth0") is None  # cleared at last: nothing left to report
