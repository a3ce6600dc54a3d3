"""`lossbed doctor` on namespace clusters with features removed: nft off PATH, a kernel
module this kernel lacks, no GPU. Each is named with its fix; exit codes as its --help says:
0 the run can work, 3 something it needs is missing, 2 bad options, 4 no such cluster."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from testbed.host import checkup
from tests.helpers import lossbed, unique_name

pytestmark = pytest.mark.netns


@pytest.fixture(scope="module")
def cluster():
    name = unique_name()
    up = lossbed("up", "--hosts", "2", "--name", name)
    assert up.returncode == 0, up.stderr
    yield name
    assert lossbed("down", name).returncode == 0


def _findings(result) -> dict[tuple[str, str], dict]:
    return {(f["host"], f["check"]): f for f in json.loads(result.stdout)["findings"]}


def _path_without(tmp_path: Path, *missing: str) -> str:
    """A PATH with every command of this one but `missing` (links in a folder of its own)."""
    folder = tmp_path / "bin"
    folder.mkdir()
    for directory in os.environ["PATH"].split(os.pathsep):
        if not os.path.isdir(directory):
            continue
        for entry in os.listdir(directory):
            target = folder / entry
            if entry not in missing and not target.exists():
                target.symlink_to(Path(directory) / entry)
    return str(folder)


def test_a_cluster_that_can_run_passes_with_every_check_in_the_table(cluster):
    result = lossbed("doctor", "--cluster", cluster)
    assert result.returncode == 0, result.stdout + result.stderr
    for check in ("namespaces", "CAP_NET_ADMIN", "nft", "sch_netem", "NIC", "Python",
                  "compiled core", "torch", "CUDA", "GPUs", "NCCL", "clock offset",
                  "loss backend"):
        assert f"  {check} " in result.stdout, f"{check} missing from the table"
    assert "everything this run needs is there" in result.stdout


def test_nft_off_path_is_named_with_its_fix_and_blocks_only_a_run_that_needs_it(cluster,
                                                                                tmp_path):
    path = _path_without(tmp_path, "nft")
    env_path = {"PATH": path}
    chosen = _with_env(env_path, "doctor", "--cluster", cluster, "--json")
    assert chosen.returncode == 0, chosen.stdout + chosen.stderr  # bpf applies the loss
    nft = _findings(chosen)[("h1", "nft")]
    assert nft["state"] == "not on PATH" and not nft["ok"] and not nft["needed"]
    assert "apt-get install nftables" in nft["fix"]

    forced = _with_env(env_path, "doctor", "--cluster", cluster, "--loss-backend", "nft")
    assert forced.returncode == 3, forced.stdout + forced.stderr
    assert "nft: not on PATH. Fix: apt-get install nftables" in forced.stdout


def _with_env(extra: dict, *args: str):
    import subprocess

    from tests.helpers import LOSSBED, REPO, with_repo_on_path

    return subprocess.run([*LOSSBED, *args], capture_output=True, text=True, timeout=120,
                          cwd=REPO, env={**os.environ, "PYTHONPATH": with_repo_on_path(),
                                         **extra})


def test_a_module_the_kernel_lacks_blocks_the_profile_that_needs_it(cluster):
    probe = lossbed("doctor", "--cluster", cluster, "--json")
    netem = json.loads(probe.stdout)["facts"]["h1"]["backends"]["netem"]
    if netem is None:
        pytest.skip("this kernel has sch_netem: the case is held by the unit test below")
    result = lossbed("doctor", "--cluster", cluster, "--profile", "wan")
    assert result.returncode == 3, result.stdout + result.stderr
    assert "profile wan" in result.stdout and "MISSING" in result.stdout
    assert "no sch_netem" in result.stdout
    assert "linux-modules-extra" in result.stdout and "lossbed up --kind vm" in result.stdout
    # the same hosts can still run a profile the other backends express
    assert lossbed("doctor", "--cluster", cluster, "--profile", "random-loss").returncode == 0


def test_no_gpu_blocks_a_cuda_run_and_nccl(cluster):
    facts = json.loads(lossbed("doctor", "--cluster", cluster, "--json").stdout)["facts"]
    if facts["h1"]["python"].get("gpus"):
        pytest.skip("this machine has a GPU")
    result = lossbed("doctor", "--cluster", cluster, "--device", "cuda")
    assert result.returncode == 3
    assert "GPUs: 0. Fix: a GPU, or --device cpu" in result.stdout
    assert "CUDA: a CPU build of torch. Fix:" in result.stdout
    nccl = lossbed("doctor", "--cluster", cluster, "--process-group", "nccl", "--json")
    assert nccl.returncode == 3
    nccl_rows = [f for (_, check), f in _findings(nccl).items() if check == "NCCL"]
    assert nccl_rows and all(f["needed"] and not f["ok"] for f in nccl_rows)


def test_bad_options_and_a_missing_cluster_have_their_exit_codes(cluster):
    assert lossbed("doctor", "--cluster", cluster, "--device", "tpu").returncode == 2
    missing = lossbed("doctor", "--cluster", "tnosuch")
    assert missing.returncode == 4 and "tnosuch" in missing.stderr


@pytest.mark.parametrize("layout, expected", [
    ({"sys/module/sch_netem": None}, "loaded"),
    ({"lib/modules/R/modules.builtin": "kernel/net/sched/sch_netem.ko\n"}, "built-in"),
    ({"lib/modules/R/modules.dep": "kernel/net/sched/sch_netem.ko.xz: kernel/x.ko\n"},
     "installed"),
    ({"lib/modules/R/modules.dep": "kernel/net/sched/sch_htb.ko:\n"}, None),
    ({}, "unknown"),
])
def test_a_module_is_found_where_the_kernel_lists_it(tmp_path, layout, expected):
    for relative, text in layout.items():
        path = tmp_path / relative
        if text is None:
            path.mkdir(parents=True)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    assert checkup.module_state("sch_netem", release="R", root=tmp_path) == expected


def test_train_runs_the_checks_before_launching_ranks(cluster):
    facts = json.loads(lossbed("doctor", "--cluster", cluster, "--json").stdout)["facts"]
    if facts["h1"]["python"].get("gpus"):
        pytest.skip("this machine has a GPU")
    result = lossbed("train", "--cluster", cluster, "--device", "cuda", "--steps", "1",
                     "--batch", "2", "--seq-len", "32", "--tokenizer", "bytes")
    assert result.returncode == 3, result.stderr[-2000:]
    assert "the hosts cannot run this" in result.stderr
    assert "GPUs: 0. Fix: a GPU, or --device cpu" in result.stderr
    assert "rank" not in result.stderr.lower(), "ranks were launched before the check"
