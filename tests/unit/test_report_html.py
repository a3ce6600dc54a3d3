"""A bench's report.html: one self-contained page (every plot embedded, nothing fetched) that
a real browser loads with no console error and every image decoded; `lossbed report DIR`
redraws it from the bench's files. (Records as a bench writes them, made here.)"""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest

from harness.bench import report
from harness.bench.summary import summarise
from harness.metrics.hdr import Histogram
from tests.helpers import lossbed

BROWSERS = ("chromium-headless-shell", "chromium", "chromium-browser", "google-chrome")


def record(variant: str, loss: float, seed: int, role: str, ppl: float) -> dict:
    hist = Histogram()
    for us in (9000, 10000, 11000, 12000, 30000):
        hist.record(us)
    return {"variant": variant, "loss": loss, "seed": seed, "role": role, "ppl": ppl,
            "profile": "random-loss" if loss else "clean", "loss_seed": seed,
            "steps": 40 if role.startswith("speed") else 300, "hosts": 4,
            "tokens_per_s": 4000.0 if variant != "reliable" or loss == 0 else 1000.0,
            "step_ms": hist.summary(), "step_hist": hist.to_dict(),
            "measured_loss": loss * 1.01 if loss else 0.0,
            "measured_loss_interval": [loss * 0.99, loss * 1.03] if loss else None,
            "drift": 0.0, "losses": [5.0 - i / 100 for i in (range(40) if role.startswith(
                "speed") else range(300))], "model_sha": "m", "packets_lost": 0,
            "run_s": 10.0}


@pytest.fixture
def bench_folder(tmp_path):
    records = []
    for seed in (0, 1):
        records += [record("reliable", 0.0, seed, "reference", 10.0),
                    record("rps", 0.0, seed, "reference", 11.0),
                    record("unbiased_drift", 0.1, seed, "lossy", 10.5 + seed / 10),
                    record("rps", 0.1, seed, "lossy", 11.1),
                    record("reliable", 0.1, seed, "speed", 0.0),
                    record("reliable", 0.0, seed, "speed_reference", 0.0)]
    summary = summarise(records, {"losses": [0.1], "steps": 300}, "bpf", wall_s=200,
                        regime="scratch: 300 steps at adamw peak 0.002")
    report.write_outputs(tmp_path, records, summary)
    return tmp_path


def test_the_report_is_one_file_with_every_plot_and_the_answer(bench_folder):
    page = (bench_folder / "report.html").read_text()
    images = re.findall(r'src="data:image/png;base64,([^"]+)"', page)
    assert len(images) >= 4 and not re.search(r'src="(?!data:)', page)  # nothing fetched
    for name in ("ppl_delta.png", "loss_curves.png", "loss_curves_speed.png",
                 "step_time_cdf.png", "measured_loss.png"):
        assert name in page and (bench_folder / name).is_file(), name
        assert f"![{name}]({name})" in (bench_folder / "summary.md").read_text()
    assert "unbiased_drift" in page and "Provenance" in page and "commit" in page
    # results.jsonl keeps what the CDF is drawn from
    first = json.loads((bench_folder / "results.jsonl").read_text().splitlines()[0])
    assert first["step_hist"]


def test_the_speed_runs_are_drawn_apart_from_the_full_length_runs():
    from harness.bench.plots import loss_curves

    records = [record("reliable", 0.0, 0, "reference", 10.0),
               record("reliable", 0.1, 0, "speed", 0.0),
               record("rps", 0.1, 0, "lossy", 11.0)]
    full = loss_curves(records, 0.1)
    speed = loss_curves(records, 0.1, speed=True)
    assert [len(c) for _, c in full] == [300, 300] and [len(c) for _, c in speed] == [40]


def test_lossbed_report_redraws_a_past_bench(bench_folder):
    for name in ("report.html", "summary.md", "ppl_delta.png"):
        (bench_folder / name).unlink()
    done = lossbed("report", str(bench_folder), timeout=120)
    assert done.returncode == 0, done.stderr
    assert (bench_folder / "report.html").is_file() and (bench_folder / "ppl_delta.png").is_file()
    missing = lossbed("report", str(bench_folder / "nowhere"), timeout=60)
    assert missing.returncode == 2 and "holds no bench" in missing.stderr


def test_a_real_browser_loads_it_without_errors_and_decodes_every_image(bench_folder):
    browser = next((shutil.which(b) for b in BROWSERS if shutil.which(b)), None)
    if browser is None:
        pytest.skip("no Chromium here (make setup installs chromium-headless-shell on Debian)")
    # a copy of the page that reports, once loaded, how many images decoded, into its DOM
    page = (bench_folder / "report.html").read_text()
    probe = ("<script>window.addEventListener('load',()=>{const i=[...document.images];"
             "document.body.setAttribute('data-decoded',i.filter(x=>x.complete&&"
             "x.naturalWidth>0).length+'/'+i.length)})</script></body>")
    checked = bench_folder / "checked.html"
    checked.write_text(page.replace("</body>", probe))
    done = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu",
                           "--enable-logging=stderr", "--v=0", "--virtual-time-budget=5000",
                           "--dump-dom", checked.as_uri()],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    decoded = re.search(r'data-decoded="(\d+)/(\d+)"', done.stdout)
    assert decoded, done.stdout[-500:]
    assert decoded.group(1) == decoded.group(2) and int(decoded.group(2)) >= 4
    console = [line for line in done.stderr.splitlines() if "CONSOLE" in line
               and ("error" in line.lower() or "uncaught" in line.lower())]
    assert console == []
