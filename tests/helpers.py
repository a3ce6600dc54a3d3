"""Helpers shared by the privileged tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

from testbed import clusters
from testbed.clusters import netns as netns_cluster
from testbed.clusters import state

REPO = Path(__file__).resolve().parents[1]
LOSSBED = [sys.executable, "-m", "harness.cli"]


# A script for `lossbed run` whose rank 1 fails once the job joined (its peers then wait
# in the collective for it): what the failure's report is tested with
RANK_ONE_FAILS = (
    "import torch, torch.distributed as dist\n"
    "from torch.nn.parallel import DistributedDataParallel as DDP\n"
    "import harness.api as lossbed\n"
    "dist.init_process_group('gloo')\n"
    "model = DDP(torch.nn.Linear(4, 1))\n"
    "lossbed.lossy_gradients(model)\n"
    "if dist.get_rank() == 1:\n"
    "    raise RuntimeError('rank one gives up')\n"
    "for _ in range(1000):\n"
    "    model(torch.ones(2, 4)).sum().backward()\n")


def unique_name() -> str:
    """A cluster name no other test uses: leftovers can be traced to the test by name."""
    return "t" + uuid.uuid4().hex[:6]


def lossbed(*args: str, check: bool = False, timeout: float = 120,
            env: dict | None = None, cwd=REPO) -> subprocess.CompletedProcess:
    """Run the real CLI in a subprocess, as a user would (in `env`: this environment; in
    the folder `cwd`: the checkout)."""
    return subprocess.run(
        [*LOSSBED, *args], capture_output=True, text=True, timeout=timeout, check=check,
        cwd=cwd, env={**(os.environ if env is None else env),
                       "PYTHONPATH": with_repo_on_path()},
    )


def with_repo_on_path() -> str:
    """PYTHONPATH with the checkout first, keeping what the tests put there (the fork
    audit's folder: tests/conftest.py)."""
    return os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)


def leftovers(name: str) -> dict:
    """Everything of cluster `name` that is still on this machine."""
    return {
        "namespaces": netns_cluster.cluster_namespaces(name),
        "etc_netns": sorted(p.name for p in netns_cluster.NETNS_ETC.glob(f"lossbed-{name}-*")),
        "state": state.cluster_dir(name).exists(),
    }


NOTHING = {"namespaces": [], "etc_netns": [], "state": False}


def assert_job_left_nothing(cluster) -> None:
    """After a job on a live cluster: its profile cleared, no lossbed nft table on any host,
    no process left in the hosts' namespaces (the cluster itself stays)."""
    from testbed.host.hosts import is_running, processes_in_namespaces
    from testbed.impair import engine

    assert engine.read_record(cluster) is None  # the profile was cleared
    tables = [h.run(["nft", "list", "tables"]).stdout for h in cluster.hosts]
    assert not any(b"lossbed" in t for t in tables)
    namespaces = [h.namespace for h in cluster.hosts]
    left = [p for pids in processes_in_namespaces(namespaces).values() for p in pids
            if is_running(p)]
    assert left == []


def send_between_vms(cluster, count: int, rate_pps: int = 4000) -> dict:
    """h2 sends `count` numbered datagrams to h1; h1 counts them (both inside the VMs)."""
    h1, h2 = cluster.hosts
    out = {}

    def receive():
        out["recv"] = h1.run([h1.python, "-m", "testbed.impair.traffic", "recv",
                              "--bind", h1.address, "--count", str(count), "--idle-s", "3"],
                             timeout=600)

    thread = threading.Thread(target=receive)
    thread.start()
    # The receiver's Python starts slowly under TCG (0.5 s idle, seconds when the VMs
    # compete for the 2 cores); datagrams sent before it binds would count as lost. A VM's
    # exec channel runs one command at a time, so h1 cannot be asked whether it is bound.
    time.sleep(5)
    sent = h2.run([h2.python, "-m", "testbed.impair.traffic", "send", "--to", h1.address,
                   "--count", str(count), "--rate-pps", str(rate_pps)], timeout=600)
    thread.join()
    assert sent.returncode == 0, sent.stderr
    assert out["recv"].returncode == 0, out["recv"].stderr
    return json.loads(out["recv"].stdout)


def two_vm_hosts(**spec):
    """A module's 2-VM cluster (a generator for a fixture): booted, then taken down and
    checked clean."""
    from testbed.clusters.vm import cluster as vm_cluster

    name = unique_name()
    cluster = vm_cluster.up(vm_cluster.VMSpec(hosts=2, name=name, **spec))
    yield cluster
    clusters.down(name)
    assert leftovers(name) == NOTHING


def untrained_ppl(cfg) -> float:
    """The perplexity of the model a run starts from (its preset, seed, corpus, tokenizer and
    held-out split), computed here: a model that trained at all scores below it, while a
    bound like `ppl < 256` also passes a model worse than the byte-level chance of 256."""
    from harness.data.corpus import load_documents, prepare
    from harness.eval.perplexity import perplexity
    from harness.model import presets

    documents, source = load_documents(cfg.corpus, cfg.hf_dataset,
                                       hf_text_field=cfg.hf_text_field)
    tok, corpus = prepare(documents, source, cfg.tokenizer, cfg.seq_len)
    model = presets.build(cfg.preset, tok.vocab_size, cfg.seed)
    return perplexity(model, corpus.heldout, tok.token_bytes, cfg.eval_tokens or None)


def ansible_env(scratch) -> dict:
    """The environment for Ansible's tools in a test: their state in `scratch`, not in the
    user's home (a user without a writable home — or one whose ~/.ansible must not change —
    runs the tests too)."""
    return {**os.environ, "ANSIBLE_HOME": str(scratch / "ansible-home"),
            "ANSIBLE_LOCAL_TEMP": str(scratch / "ansible-tmp"),
            "XDG_CACHE_HOME": str(scratch / "cache"), "HOME": str(scratch)}
