"""`npurun bench`: runs, prints the benchmark_app-style report for both runtimes, writes JSON.
Timings are printed, never asserted."""
import json

import pytest

from npurun import zoo
from npurun.cli import main


def test_bench_prints_both_reports_and_writes_json(tmp_path, capsys):
    pytest.importorskip("onnxruntime")
    out = tmp_path / "b.json"
    rc = main(["bench", str(zoo.path("espcn_x3.onnx")), "--shape", "input=1x1x24x40", "--threads", "1",
               "-t", "0", "--min-runs", "3", "--json", str(out)])
    text = capsys.readouterr().out
    assert rc == 0
    for word in ("[ npurun ]", "[ onnxruntime ]", "Count:", "Median:", "p99:", "Throughput:", "sgemm peak", "ratio"):
        assert word in text
    res = json.loads(out.read_text())
    assert res["results"]["npurun"]["count"] >= 3 and res["threads"] == 1
    assert {"ratio_npurun_over_peer", "sgemm_peak_gflops", "gflop_per_run", "machine", "versions"} <= set(res)


def test_bench_needs_a_shape_for_symbolic_inputs(capsys):
    assert main(["bench", str(zoo.path("espcn_x3.onnx")), "--vs", "none", "-t", "0"]) == 1
    assert "--shape input=" in capsys.readouterr().err


def test_the_ops_ab_bench_runs_and_checks_its_outputs():
    """bench/cpu_ops_ab.py compares each pair's outputs before timing them: one round of it
    (the README's numbers come from it)."""
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    p = subprocess.run([sys.executable, str(root / "bench" / "cpu_ops_ab.py"), "--runs", "1"], capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "max_pool (1, 64, 112, 112) 3x3 s2, 2T" in p.stdout and "strided 1x1 1024->2048" in p.stdout, p.stdout
