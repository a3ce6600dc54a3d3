"""A report you can compare (#66 item 7): `lossbed run` writes summary.md and report.html
beside its summary.json as a bench does; `lossbed report` redraws a run's folder and a
`bench --many-rank` folder; `lossbed compare RUN_A RUN_B` puts two runs side by side."""

from __future__ import annotations

import json

import pytest

from harness import cli, run_report


def _run(tokens_per_s: float, loss, measured: float, ppl: float) -> dict:
    """A `lossbed run` summary.json, as harness/torchrun.py's summarise writes it."""
    return {"command": "torchrun train.py", "profile": "random-loss", "sets": [],
            "loss": loss, "transport": "udp", "impair_from": "joined", "hosts": ["h1", "h2"],
            "ranks": 2, "exit_code": 0, "joined": True, "applied": True,
            "coverage": {"fraction": 0.998}, "measured_loss": measured,
            "measured_loss_interval": [measured * 0.9, measured * 1.1] if measured else None,
            "missing_fraction": measured, "steps": 40, "steps_per_s": 4.0,
            "tokens_per_s": tokens_per_s, "step_ms": {"p50": 250.0, "p99": 400.0, "max": 500.0},
            "collective_ms": {"p50": 20.0, "p99": 60.0, "max": 80.0},
            "transport_counters": {}, "collective_totals": {},
            "script": {"heldout_ppl": ppl, "final_loss": 3.1}, "failed": [], "wall_s": 12.0,
            "timed_out": False, "stopped_by": None}


def _write_run(folder, summary) -> None:
    folder.mkdir()
    (folder / "summary.json").write_text(json.dumps(summary))


def test_a_runs_report_says_what_was_asked_measured_and_reported(tmp_path):
    run_report.write(tmp_path, _run(9000.0, 0.1, 0.1003, 41.5))
    text = (tmp_path / "summary.md").read_text()
    shown = {line[:21].strip(): line[21:].strip() for line in text.splitlines()[3:-1]}
    assert shown["loss asked (--loss)"] == "0.1" and shown["measured loss"] == "10.03%"
    assert shown["coverage"] == "99.80%" and shown["tokens/s"] == "9000"
    assert shown["step p99 ms"] == "400" and shown["script: heldout_ppl"] == "41.5"
    page = (tmp_path / "report.html").read_text()
    assert "<th>measured loss</th><td>10.03%</td>" in page and "heldout_ppl" in page
    assert "the profile's own" in run_report.table(_run(9000.0, None, 0.011, 41.5))


def test_report_redraws_a_runs_folder_and_a_many_rank_folder(tmp_path, capsys):
    _write_run(tmp_path / "run", _run(9000.0, 0.1, 0.1003, 41.5))
    assert cli.main(["report", str(tmp_path / "run")]) == 0
    assert (tmp_path / "run" / "summary.md").is_file()
    assert (tmp_path / "run" / "report.html").is_file()
    assert "redrew" in capsys.readouterr().out
    many = tmp_path / "many"
    many.mkdir()
    (many / "reproduction.json").write_text(json.dumps(_reproduction(0.12, "holds")))
    assert cli.main(["report", str(many)]) == 0
    assert "| 8a |" in (many / "reproduction.md").read_text()


def _reproduction(measured: float, said: str) -> dict:
    check = {"quantity": "Δppl % of unbiased_drift", "measured": measured,
             "half_width": 0.1, "predicted": 0.0, "tolerance": 0.8, "trials": 2,
             "disturbed": None, "verdict": said}
    return {"mode": "bench --many-rank", "commit": "x", "date": "d", "seconds": {},
            "claims": [{"row": "8a", "paper": "arXiv 2507.07114", "claim": "c",
                        "prediction": "p", "verdict": said, "measured": check,
                        "checks": [check]}]}


def test_compare_puts_a_reliable_run_and_a_lossy_one_side_by_side(tmp_path, capsys):
    _write_run(tmp_path / "reliable", _run(3000.0, 0.1, 0.1001, 41.2))
    _write_run(tmp_path / "lossy", _run(9000.0, 0.1, 0.0999, 41.5))
    assert cli.main(["compare", str(tmp_path / "reliable"), str(tmp_path / "lossy")]) == 0
    out = capsys.readouterr().out
    tokens = next(line for line in out.splitlines() if line.startswith("tokens/s"))
    assert tokens.split()[1:] == ["3000", "9000", "3.000"]
    ppl = next(line for line in out.splitlines() if line.startswith("script: heldout_ppl"))
    assert ppl.split()[-1] == f"{41.5 / 41.2:.3f}"


def test_compare_of_two_many_rank_folders_and_of_mixed_kinds(tmp_path, capsys):
    for name, measured, said in (("a", 0.12, "holds"), ("b", 1.5, "does not hold")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "reproduction.json").write_text(
            json.dumps(_reproduction(measured, said)))
    assert cli.main(["compare", str(tmp_path / "a"), str(tmp_path / "b")]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("8a"))
    assert line.split() == ["8a", "+0.12", "holds", "+1.5", "does", "not", "hold"]
    _write_run(tmp_path / "run", _run(3000.0, 0.1, 0.1, 41.2))
    assert cli.main(["compare", str(tmp_path / "a"), str(tmp_path / "run")]) == 2
    assert "are not of one kind (many-rank and run)" in capsys.readouterr().err


@pytest.mark.parametrize("summary", [{"rows": []}, {"command": "x", "rows": []}])
def test_a_benchs_summary_is_not_a_run(summary):
    assert not run_report.is_run(summary)
