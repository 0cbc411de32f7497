"""docs/adding-ops.md runs as written: its my_ops.py, its Python session and its commands
(register a user op, import it from an ONNX file of its own domain, run it on cpu and
reference, print and parse .npuir, a pass's group question, npusim's estimate)."""
from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

import pytest

from npurun.registry import registered_ops, unregister_op

DOC = Path(__file__).resolve().parents[1] / "docs" / "adding-ops.md"


def _blocks() -> dict:
    """The doc's code blocks marked `<!-- test: NAME -->`, by name."""
    text = DOC.read_text()
    found = dict(re.findall(r"<!-- test: (\S+) -->\n```\w*\n(.*?)```", text, re.S))
    assert set(found) == {"my_ops.py", "session", "shell"}, sorted(found)
    return found


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    sys.modules.pop("my_ops", None)
    if "my.ops.scaled_tanh" in registered_ops():
        unregister_op("my.ops.scaled_tanh")


def test_the_example_runs_as_written(workdir, capsys):
    from npurun.cli import main
    blocks = _blocks()
    (workdir / "my_ops.py").write_text(blocks["my_ops.py"])
    exec(compile(blocks["session"], str(DOC) + ":session", "exec"), {"__name__": "__doc_session__"})
    out = capsys.readouterr().out
    assert "op my.ops.scaled_tanh (x: [N, 64] f32 DRAM0 -> y: [N, 64] f32 DRAM0)" in out
    outputs = {}
    for line in blocks["shell"].strip().splitlines():
        argv = shlex.split(line)
        assert argv[0] == "npurun", line
        assert main(argv[1:]) == 0, (line, capsys.readouterr().err)
        outputs[line] = capsys.readouterr().out
    # the cpu backend runs it with its own kernel; torch:cpu (no torch kernel) falls back
    report = outputs["npurun --ops my_ops.py ops-report tanh_model.onnx --device cpu"]
    cpu_row = next(ln for ln in report.splitlines() if "my.ops.scaled_tanh" in ln)
    assert cpu_row.split()[3] == "cpu", cpu_row
    report = outputs["npurun --ops my_ops.py ops-report tanh_model.onnx --device torch:cpu"]
    torch_row = next(ln for ln in report.splitlines() if "my.ops.scaled_tanh" in ln)
    assert torch_row.split()[3] == "reference" and "no PyTorch lowering" in torch_row, torch_row
    assert "op my.ops.scaled_tanh" in outputs["npurun --ops my_ops.py ir print tanh_model.onnx"]
    assert "effective TOPS" in outputs[
        "npurun --ops my_ops.py estimate tanh_model.onnx --device x-elite-hexagon --shape x=8x64"]
    import numpy as np
    y = np.load(workdir / "out" / "y.npy")
    assert np.allclose(y, 2.0 * np.tanh(0.5 * np.load(workdir / "x.npy")), atol=1e-6)


def test_refusals_quoted_in_the_doc_are_the_real_messages():
    import numpy as np

    import npurun
    text = DOC.read_text()
    for call, kw in ((lambda: npurun.register_op("Tanh2", domain="my.ops", reference=np.tanh), None),
                     (lambda: npurun.register_op("matmul", inputs=["a", "b"], reference=np.matmul), None)):
        with pytest.raises(npurun.NpurunError) as e:
            call()
        assert str(e.value) in text, str(e.value)

    def f(x):
        return x
    with pytest.raises(npurun.NpurunError) as e:
        npurun.register_op("scaled_tanh", domain="my.ops", attrs={"alpha": 1.0, "beta": 1.0}, reference=f)
    assert str(e.value) in text, str(e.value)
