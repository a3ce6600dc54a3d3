"""`bench --min-coverage` reaches every run of the bench (it was parsed and then dropped: each
run was judged against the default), and a bad value is refused before anything runs."""

from __future__ import annotations

import pytest

from harness import cli
from harness.bench import training_bench
from harness.bench.spec import BenchSpec
from testbed.errors import UsageError


def test_the_bench_judges_every_run_against_its_min_coverage(monkeypatch, tmp_path):
    seen = {}

    def train_runs(cluster, runs, out, echo, **options):
        seen.update(options)
        raise RuntimeError("stop before training")

    monkeypatch.setattr(training_bench.run, "train_runs", train_runs)
    spec = BenchSpec.make(losses=[0.1], seeds=1, steps=5, variants=["reliable"], min_coverage=0.5,
                          regime="scratch")  # (finetune would train checkpoints first)
    with pytest.raises(RuntimeError, match="stop before training"):
        training_bench.run_bench(object(), spec, tmp_path, echo=lambda _: None)
    assert seen["min_coverage"] == 0.5


@pytest.mark.parametrize("value", [-0.1, 1.5, float("nan")])
def test_a_min_coverage_that_is_no_fraction_is_refused(value, capsys):
    with pytest.raises(UsageError) as err:
        BenchSpec.make(losses=[0.1], min_coverage=value)
    assert err.value.field == "--min-coverage"
    assert cli.main(["bench", "--min-coverage", str(value)]) == 2
    assert "--min-coverage" in capsys.readouterr().err
