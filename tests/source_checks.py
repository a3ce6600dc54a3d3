"""The checks that read lossbed's own source, each beside the planted case it must fire on.

A check that scans the code for a pattern and finds nothing proves nothing unless it is
seen to find the pattern where it is: every check here carries a planted module that breaks
its rule (the lines it must name) and a near miss that keeps it (nothing to name). The
suite runs each check over the repository and over both plants (tests/unit/
test_source_checks.py); a check is added here with its plants, or not at all (#71)."""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from tests.helpers import REPO


@dataclass(frozen=True)
class SourceCheck:
    """A rule over production modules. `find(text, path)` names the lines (numbers) of one
    module that break it; `applies(path)` says whether a module (repository-relative, posix)
    is held to it."""

    name: str
    why: str
    folders: tuple[str, ...]
    find: Callable[[str, str], list[int]]
    planted: str                 # a module that breaks the rule ...
    planted_lines: tuple[int, ...]  # ... at these lines
    near_miss: str               # one that looks alike and keeps it
    planted_path: str = "harness/planted.py"
    applies: Callable[[str], bool] = lambda path: True
    suffixes: tuple[str, ...] = (".py",)


def sources(check: SourceCheck) -> Iterator[tuple[str, str]]:
    """(relative path, text) of every module the check holds."""
    for folder in check.folders:
        for path in sorted((REPO / folder).rglob("*")):
            relative = path.relative_to(REPO).as_posix()
            if path.suffix in check.suffixes and check.applies(relative):
                yield relative, path.read_text()


def scan(check: SourceCheck) -> list[str]:
    """Every breach of the check in the repository, as path:line."""
    return [f"{path}:{line}" for path, text in sources(check)
            for line in check.find(text, path)]


def _walk(text: str) -> Iterator[ast.AST]:
    return ast.walk(ast.parse(text))


def _imported_names(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom) and node.level == 0:
        return [node.module or ""]
    return []


# ---- the house (#44) ----------------------------------------------------------------------

MODULE_LINES = 500
CLASS_LINES = 310  # "~300": the largest room's share of a module


def long_modules(text: str, path: str) -> list[int]:
    head = "\n".join(text.splitlines()[:60])
    return [1] if text.count("\n") > MODULE_LINES and "Why one file" not in head else []


def long_classes(text: str, path: str) -> list[int]:
    return [n.lineno for n in _walk(text)
            if isinstance(n, ast.ClassDef) and n.end_lineno - n.lineno >= CLASS_LINES]


def harness_imports(text: str, path: str) -> list[int]:
    return [n.lineno for n in _walk(text)
            if any(m == "harness" or m.startswith("harness.") for m in _imported_names(n))]


def tests_imports(text: str, path: str) -> list[int]:
    return [n.lineno for n in _walk(text)
            if any(m == "tests" or m.startswith("tests.") for m in _imported_names(n))]


# ---- one rule, one module ------------------------------------------------------------------

RULES_MESSAGE = re.compile(r"is not a fraction in \[0, 1[)\]]|is not a number of seconds|"
                           r"is not a positive learning rate")


def rules_messages(text: str, path: str) -> list[int]:
    return [i for i, line in enumerate(text.splitlines(), 1) if RULES_MESSAGE.search(line)]


def private_loss_rules(text: str, path: str) -> list[int]:
    """A loss fraction bounded by a comparison of its own (0 <= rate < 1, 0 < loss < 1...)
    rather than by testbed/checks.loss_fraction."""
    found = []
    for n in _walk(text):
        if (isinstance(n, ast.Compare) and len(n.comparators) == 2
                and isinstance(n.left, ast.Constant) and n.left.value == 0
                and isinstance(n.comparators[1], ast.Constant) and n.comparators[1].value == 1
                and re.search(r"rate|loss|fraction|drop", ast.unparse(n.comparators[0]))):
            found.append(n.lineno)
    return found


def loss_as_set_text(text: str, path: str) -> list[int]:
    return [n.lineno for n in _walk(text)
            if isinstance(n, ast.JoinedStr) and any(
                isinstance(v, ast.Constant) and "loss_pct=" in str(v.value) for v in n.values)]


# ---- the compiled core's face (#44) --------------------------------------------------------

NATIVE_CALLS = {"apply", "screen", "in_order", "send"}


def raw_core_calls(text: str, path: str) -> list[int]:
    """Calls into _wire from anywhere but native.py."""
    if path.endswith("/native.py"):
        return []
    return [n.lineno for n in _walk(text) if isinstance(n, ast.Call)
            and isinstance(n.func, ast.Attribute) and ast.unparse(n.func.value) == "_wire"]


def crowded_core_calls(text: str, path: str) -> list[int]:
    """native.apply, screen, in_order and a Sender's send take their buffers and rows by
    position and everything else by name."""
    found = []
    for n in _walk(text):
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute):
            owner = ast.unparse(n.func.value)
            if n.func.attr in NATIVE_CALLS and len(n.args) > 2 and (
                    "native" in owner or "_tx" in owner or "tx_again" in owner):
                found.append(n.lineno)
    return found


# ---- torch.distributed behind one door -----------------------------------------------------

DIRECT_CALLS_ALLOWED = {"harness/collectives/process_group.py",
                        "harness/collectives/reliable.py"}
TENSOR_CALLS = {"all_reduce", "broadcast", "all_gather", "reduce", "gather", "scatter",
                "reduce_scatter", "send", "recv"}


def tensors_to_dist(text: str, path: str) -> list[int]:
    return [n.lineno for n in _walk(text)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
            and n.func.attr in TENSOR_CALLS and isinstance(n.func.value, ast.Name)
            and n.func.value.id == "dist"]


# ---- the Pythons GPU hosts bring (3.11-3.13) ----------------------------------------------

# Modules removed in 3.12 (PEP 632, asyncore's kin, imp) and 3.13 (PEP 594's dead batteries)
REMOVED_MODULES = {
    "distutils", "imp", "asynchat", "asyncore", "smtpd",
    "aifc", "audioop", "cgi", "cgitb", "chunk", "crypt", "imghdr", "mailcap", "msilib", "nis",
    "nntplib", "ossaudiodev", "pipes", "sndhdr", "spwd", "sunau", "telnetlib", "uu", "xdrlib",
    "lib2to3",
}
# Calls and names deprecated in 3.12 or 3.13, by the attribute a caller writes
DEPRECATED_ATTRIBUTES = {
    "utcnow": "datetime.utcnow (3.12): datetime.now(timezone.utc)",
    "utcfromtimestamp": "datetime.utcfromtimestamp (3.12): fromtimestamp(t, timezone.utc)",
    "getdefaultlocale": "locale.getdefaultlocale (3.11, removed 3.15)",
    "find_loader": "pkgutil.find_loader (3.12): importlib.util.find_spec",
    "get_loader": "pkgutil.get_loader (3.12): importlib.util.find_spec",
    "Num": "ast.Num (3.12): ast.Constant",
    "Str": "ast.Str (3.12): ast.Constant",
    "NameConstant": "ast.NameConstant (3.12): ast.Constant",
    "get_event_loop": "asyncio.get_event_loop without a running loop (3.12)",
    "getargspec": "inspect.getargspec: removed in 3.11",
}
DEPRECATED_KEYWORDS = {"onerror": "shutil.rmtree(onerror=) (3.12): onexc="}


def removed_or_deprecated(text: str, path: str) -> list[int]:
    found = []
    for n in _walk(text):
        if any(m.split(".")[0] in REMOVED_MODULES for m in _imported_names(n)):
            found.append(n.lineno)
        if isinstance(n, ast.Attribute) and n.attr in DEPRECATED_ATTRIBUTES:
            found.append(n.lineno)
        if isinstance(n, ast.keyword) and n.arg in DEPRECATED_KEYWORDS:
            found.append(n.value.lineno)
    return found


# ---- contracts: ask, do not probe ----------------------------------------------------------


def _is_transport(node: ast.AST) -> bool:
    return ast.unparse(node) in ("t", "transport", "self.transport")


def transport_probes(text: str, path: str) -> list[int]:
    return [n.lineno for n in _walk(text)
            if isinstance(n, ast.Call) and getattr(n.func, "id", "") in ("getattr", "hasattr")
            and n.args and _is_transport(n.args[0])]


SCREENING_REFUSALS = {"FOREIGN", "UNAUTHENTICATED", "MISDIRECTED", "MASKED"}


def screening_verdicts(text: str, path: str) -> list[int]:
    return [n.lineno for n in _walk(text)
            if isinstance(n, ast.Return) and isinstance(n.value, ast.Name)
            and n.value.id in SCREENING_REFUSALS]


def transport_private_reaches(text: str, path: str) -> list[int]:
    found = []
    for n in _walk(text):
        if (isinstance(n, ast.Attribute) and n.attr.startswith("_")
                and not n.attr.startswith("__") and isinstance(n.value, ast.Attribute)
                and n.value.attr in ("t", "transport")):
            found.append(n.lineno)
        if isinstance(n, ast.Assign) and any(
                isinstance(t, ast.Attribute) and t.attr == "stash" for t in n.targets):
            found.append(n.lineno)
    return found


def _is_cluster(node: ast.AST) -> bool:
    return isinstance(node, ast.Name) and node.id == "cluster"


def cluster_kind_tests(text: str, path: str) -> list[int]:
    """`cluster.kind == ...` or `getattr(cluster, "kind", ...) == ...` (a queue pair's kind,
    or `up --kind`'s argument, is something else)."""
    lines = []
    for n in _walk(text):
        if isinstance(n, ast.Compare) and any(
                (isinstance(s, ast.Attribute) and s.attr == "kind" and _is_cluster(s.value))
                or (isinstance(s, ast.Call) and getattr(s.func, "id", "") == "getattr"
                    and len(s.args) >= 2 and _is_cluster(s.args[0])
                    and getattr(s.args[1], "value", None) == "kind")
                for s in (n.left, *n.comparators)):
            lines.append(n.lineno)
    return lines


def cluster_probes(text: str, path: str) -> list[int]:
    return [n.lineno for n in _walk(text)
            if isinstance(n, ast.Call) and getattr(n.func, "id", "") in ("getattr", "hasattr")
            and n.args and isinstance(n.args[0], ast.Name | ast.Attribute)
            and re.fullmatch(r"cluster|host|h\d*", ast.unparse(n.args[0]).split(".")[-1])]


def timing_probes(text: str, path: str) -> list[int]:
    """getattr/hasattr on a variant's timing object (a CollectiveTiming declares what is
    read of it)."""
    return [n.lineno for n in _walk(text)
            if isinstance(n, ast.Call) and getattr(n.func, "id", "") in ("getattr", "hasattr")
            and n.args and re.search(r"\b(timing|timer|t|o)\b", ast.unparse(n.args[0]))
            and isinstance(n.args[1], ast.Constant)
            and n.args[1].value in ("collective", "rps", "totals", "replica_drift",
                                    "collective_us", "lossy_collective")]


# ---- the rank protocol ---------------------------------------------------------------------

TORCHRUN_VARIABLES = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                      "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID"}


def environment_reads(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, name) of every string name read from os.environ / os.getenv."""
    names = []
    for n in ast.walk(tree):
        key = None
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute):
            if ast.unparse(n.func) in ("os.environ.get", "os.getenv", "environ.get") and n.args:
                key = n.args[0]
        elif isinstance(n, ast.Subscript) and ast.unparse(n.value) in ("os.environ",
                                                                       "environ"):
            key = n.slice
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            names.append((n.lineno, key.value))
    return names


def _names_a_rank_variable(node: ast.AST) -> bool:
    said = ast.unparse(node)
    return said.startswith("rank_protocol.") or (
        isinstance(node, ast.Constant) and isinstance(node.value, str)
        and (node.value.startswith("LOSSBED_") or node.value in TORCHRUN_VARIABLES))


def rank_environment_by_hand(text: str, path: str) -> list[int]:
    """A rank's variable set by hand (env[rank_protocol.X] = ..., {"LOSSBED_X": ...})
    rather than through rank_protocol.RankEnv's typed fields."""
    found = []
    for n in _walk(text):
        if isinstance(n, ast.Subscript) and isinstance(n.ctx, ast.Store) \
                and _names_a_rank_variable(n.slice):
            found.append(n.lineno)
        if isinstance(n, ast.Dict) and any(k is not None and _names_a_rank_variable(k)
                                           for k in n.keys):
            found.append(n.lineno)
    return found


def rank_environment_reads(text: str, path: str) -> list[int]:
    return [line for line, name in environment_reads(ast.parse(text))
            if name.startswith("LOSSBED_") or name in TORCHRUN_VARIABLES]


# ---- the variant table (#68) -----------------------------------------------------------------

VARIANT_READERS = ("harness/train/worker.py", "harness/scale/training.py",
                   "harness/eval/models.py")


def variant_chains(text: str, path: str) -> list[int]:
    """A variant told apart by its name (`variant == "rps"`, `variant in (...)`) where the
    variant table (harness/variants.py) declares what tells them apart."""
    return [n.lineno for n in _walk(text)
            if isinstance(n, ast.Compare) and isinstance(n.left, ast.Name | ast.Attribute)
            and re.fullmatch(r"(\w+\.)*variant", ast.unparse(n.left))
            and any(isinstance(c, ast.Constant) and isinstance(c.value, str)
                    or isinstance(c, ast.Tuple | ast.Set | ast.List) for c in n.comparators)]


# ---- the GPU path (#67) --------------------------------------------------------------------


def device_wide_waits(text: str, path: str) -> list[int]:
    """A wait for a whole device or stream where one event would do: torch.cuda.synchronize()
    or a stream's .synchronize() (an Event's is its own copy's, and allowed)."""
    found = []
    for n in _walk(text):
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) \
                and n.func.attr == "synchronize":
            owner = ast.unparse(n.func.value)
            if owner in ("torch.cuda", "cuda") or "stream" in owner.lower():
                found.append(n.lineno)
    return found


# ---- the register -------------------------------------------------------------------------

CHECKS = [
    SourceCheck(
        "long modules", f"no production module over {MODULE_LINES} lines without saying "
        "why at its top ('Why one file')", ("harness", "testbed"), long_modules,
        "x = 1\n" * (MODULE_LINES + 1), (1,),
        '"""Why one file: the wire is one format."""\n' + "x = 1\n" * (MODULE_LINES + 1),
        suffixes=(".py", ".c")),
    SourceCheck(
        "long classes", f"no class of {CLASS_LINES} lines or more",
        ("harness", "testbed"), long_classes,
        "class Big:\n" + "    x = 1\n" * CLASS_LINES, (1,),
        "class Small:\n" + "    x = 1\n" * (CLASS_LINES - 1)),
    SourceCheck(
        "testbed imports harness", "the testbed (hosts, links, impairment) stands below "
        "the harness that trains on it, even inside a function", ("testbed",),
        harness_imports,
        "import harness\ndef f():\n    from harness.bench import spec\n", (1, 3),
        "import harnessing\nfrom testbed import harness_words\n",
        planted_path="testbed/planted.py"),
    SourceCheck(
        "production imports the tests", "production never imports the tests' references",
        ("harness", "testbed"), tests_imports,
        "from tests.helpers import REPO\nimport tests.reference\n", (1, 2),
        "import testbed\nfrom harness import tests_passed\n"),
    SourceCheck(
        "a rule's message written twice", "only testbed/checks.py writes a rule's message: "
        "one bad value gets one message wherever it is given", ("harness", "testbed"),
        rules_messages,
        'x = 1\nmsg = f"{v} is not a fraction in [0, 1)"\n', (2,),
        'msg = f"{v} is not a share of the hosts"\n',
        applies=lambda path: path != "testbed/checks.py"),
    SourceCheck(
        "a private copy of the loss rule", "a loss fraction is checked by the one rule, "
        "testbed/checks.loss_fraction (#68: no copies in dropmask, fates, the profile model)",
        ("harness", "testbed"), private_loss_rules,
        "def f(rate, loss):\n    if not 0 <= rate < 1:\n        pass\n"
        "    ok = 0 < self.loss < 1\n", (2, 4),
        "def f(rate, value):\n    checks.loss_fraction('--loss', rate)\n"
        "    ok = 0 < value < 1\n    near = 0 <= rate <= 2\n",
        applies=lambda path: path != "testbed/checks.py"),
    SourceCheck(
        "a loss written as set text", "the loss goes down typed: nothing builds a "
        "`loss_pct=` string", ("harness",), loss_as_set_text,
        'p = 1\nx = f"loss_pct={p * 100}"\n', (2,),
        'x = "loss_pct=10"\ny = f"loss={p}"\n'),
    SourceCheck(
        "the core called around native.py", "only native.py calls the compiled core",
        ("harness",), raw_core_calls,
        "from harness.transport import _wire\n_wire.apply(a, b)\n", (2,),
        "from harness.transport import native\nnative.apply(a, b)\n"),
    SourceCheck(
        "the core given more than its data by position", "native.apply, screen, in_order "
        "and send take buffers and rows by position, the rest by name", ("harness",),
        crowded_core_calls,
        "native.apply(buf, rows, 3)\nself._tx.send(a, b, c, d)\n", (1, 2),
        "native.apply(buf, rows, step=3)\nother.send(a, b, c)\n"),
    SourceCheck(
        "a tensor handed to torch.distributed", "only process_group.py and reliable.py call "
        "torch.distributed with a tensor", ("harness",), tensors_to_dist,
        "import torch.distributed as dist\nx = 1\ndist.all_reduce(t)\n", (3,),
        "dist.barrier()\npg.all_reduce(t)\n",
        applies=lambda path: path not in DIRECT_CALLS_ALLOWED),
    SourceCheck(
        "removed or deprecated in 3.12/3.13", "lossbed runs on the Pythons GPU hosts bring",
        ("harness", "testbed"), removed_or_deprecated,
        "import imp\nfrom distutils import util\nnow = datetime.utcnow()\n"
        "shutil.rmtree(p,\n    onerror=f)\n", (1, 2, 3, 5),
        "import importlib\nnow = datetime.now(timezone.utc)\nshutil.rmtree(p, onexc=f)\n"),
    SourceCheck(
        "the collective probes its transport", "lossy.py asks the transport what it "
        "declares, rather than probing it", ("harness/collectives",), transport_probes,
        "if hasattr(self.transport, 'stash'):\n    x = getattr(t, 'mtu', 0)\n", (1, 2),
        "x = getattr(other, 'mtu', 0)\ny = self.transport.mtu\n",
        planted_path="harness/collectives/lossy.py",
        applies=lambda path: path == "harness/collectives/lossy.py"),
    SourceCheck(
        "a screening verdict of its own", "every transport refuses a unit from the wire "
        "through transport/screening.py", ("harness",), screening_verdicts,
        "def f(x):\n    return FOREIGN\n", (2,),
        "def f(x):\n    return ACCEPTED\n",
        applies=lambda path: path != "harness/transport/screening.py"),
    SourceCheck(
        "the transport's privates reached", "GoBackN and the collectives use the transport "
        "through its joints (take_stash), never a private member",
        ("harness/transport", "harness/collectives"), transport_private_reaches,
        "x = self.t._socket\nself.transport.stash = []\n", (1, 2),
        "x = self.t.socket\nstash = self.transport.take_stash()\n",
        planted_path="harness/collectives/planted.py",
        applies=lambda path: path == "harness/transport/gobackn.py"
        or path.startswith("harness/collectives/")),
    SourceCheck(
        "a decision by a cluster's kind", "code outside testbed/clusters asks the Cluster "
        "contract instead of comparing its kind", ("harness", "testbed"), cluster_kind_tests,
        'if cluster.kind == "vm":\n    pass\nx = getattr(cluster, "kind", None) == "netns"\n',
        (1, 3), 'if qp.kind == "rc":\n    pass\n',
        applies=lambda path: not path.startswith("testbed/clusters/")),
    SourceCheck(
        "a cluster or host probed", "declare the member in the contract "
        "instead", ("harness", "testbed"), cluster_probes,
        "x = getattr(cluster, 'ssh', False)\ny = getattr(hc.host, 'gpus', 0)\n"
        "if not hasattr(h1, 'socket'):\n    pass\n", (1, 2, 3),
        "x = getattr(args, 'host', None)\ny = cluster.ssh\nz = hasattr(hosts, 'x')\n"),
    SourceCheck(
        "a timing object probed", "every variant's wrapper declares its members "
        "(harness/ddp/timing.py: CollectiveTiming); nothing probes it with getattr/hasattr",
        ("harness",), timing_probes,
        'c = getattr(timing, "collective", None)\nif hasattr(timing, "rps"):\n    pass\n'
        'd = [t for t in ts if hasattr(t, "replica_drift")]\n', (1, 2, 4),
        'c = timing.lossy_collective()\nx = getattr(args, "collective", None)\n'),
    SourceCheck(
        "a rank's variable set by hand", "the rank environment is built only through "
        "rank_protocol.RankEnv (typed fields: no raw entries, no bool -> str -> bool) (#68)",
        ("harness",), rank_environment_by_hand,
        'env = {}\nenv[rank_protocol.WORK_LOCAL] = "1"\nx = {"LOSSBED_UDP_SEGMENTATION": "0"}\n',
        (2, 3), 'told = {"work_local": True}\nv = env[rank_protocol.KEY]\n'
        'env.pop(rank_protocol.KEY, None)\n',
        applies=lambda path: not path.endswith("/rank_protocol.py")),
    SourceCheck(
        "what a rank is told read past its protocol", "only rank_protocol.py reads what a "
        "rank is told (LOSSBED_*, torchrun's variables)", ("harness",),
        rank_environment_reads,
        'import os\nx = os.environ.get("LOSSBED_MTU")\ny = os.environ["RANK"]\n', (2, 3),
        'import os\nx = os.environ.get("HOME")\ny = os.getenv("CUDA_VISIBLE_DEVICES")\n',
        applies=lambda path: not path.endswith("/rank_protocol.py")),
    SourceCheck(
        "a variant told apart by its name", "the worker, the many-rank mode and the scoring "
        "read the variant table (harness/variants.py), not `variant ==` chains (#68)",
        ("harness",), variant_chains,
        'if cfg.variant == "reliable":\n    pass\nelif cfg.variant in ("zero_fill", "unbiased"):'
        '\n    pass\n', (1, 3),
        'kind = variants.of(cfg.variant)\nif kind.wrapper == "reliable":\n    pass\n'
        'x = variants.of(cfg.variant).wrapper != "reliable"\n',
        planted_path="harness/train/worker.py",
        applies=lambda path: path in VARIANT_READERS),
    SourceCheck(
        "a whole device waited for in the hook", "a bucket's copies are waited for by their "
        "own events: the hook never stops the device or its stream (#67)", ("harness/ddp",),
        device_wide_waits,
        "import torch\ntorch.cuda.synchronize()\ntorch.cuda.current_stream(d).synchronize()\n",
        (2, 3), "copied.synchronize()\nevent.synchronize()\n",
        planted_path="harness/ddp/hooks.py"),
]
