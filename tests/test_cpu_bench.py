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
