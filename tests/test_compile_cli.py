"""`npurun compile` and `--precision` on `upscale` / `run`, through the real command line."""
import numpy as np
import pytest

import npurun
from npurun import zoo
from npurun.cli import main

ESPCN = str(zoo.path("espcn_x3.onnx"))


def test_compile_explain_and_output(tmp_path, capsys):
    out = tmp_path / "e.npuir"
    assert main(["compile", ESPCN, "-o", str(out), "--precision", "auto", "--calibrate", "random:2",
                 "--explain"]) == 0
    text = capsys.readouterr().out
    assert "precision auto, calibration random:2" in text
    for name in ("conv1", "tanh1", "conv2", "tanh2", "conv3", "pixel_shuffle"):
        line = next(ln for ln in text.splitlines() if f" {name} " in ln)
        assert len(line.split(None, 3)) == 4  # index, node, op, and a reason
    g = npurun.load(out)
    assert all(n.why for n in g.nodes) and g.values["conv1_out"].calib
    assert [n.full_op for n in g.nodes][:2] == ["conv_f16", "tanh_f16"]


def test_compile_override_and_folder(tmp_path, capsys, rng):
    cal = tmp_path / "cal"
    cal.mkdir()
    for i in range(2):
        np.save(cal / f"{i}.npy", rng.random((1, 1, 12, 16), dtype=np.float32))
    assert main(["compile", ESPCN, "--explain", "--calibrate", str(cal),
                 "--precision-override", "Conv=int8,tanh2=fp32"]) == 0
    text = capsys.readouterr().out
    assert text.count("conv_i8 ") == 3 and "forced by Conv=int8" in text and "forced by tanh2=fp32" in text


@pytest.mark.parametrize("argv,msg", [
    (["--precision-override", "Nope=int8"], "'Nope': no node matches"),
    (["--precision-override", "Conv=int9"], "unknown precision 'int9'"),
    (["--calibrate", "random:x"], "random:N"),
    (["-o", "x.onnx"], "must end in .npuir"),
])
def test_compile_bad_input_exits_1(argv, msg, capsys):
    assert main(["compile", ESPCN, "--explain"] + argv) == 1
    err = capsys.readouterr().err
    assert err.startswith("npurun: error:") and msg in err and "Traceback" not in err


def test_compile_wrong_shaped_calibration_folder(tmp_path, capsys, rng):
    np.save(tmp_path / "bad.npy", rng.random((1, 3, 8, 8), dtype=np.float32))
    assert main(["compile", ESPCN, "--explain", "--calibrate", str(tmp_path)]) == 1
    assert "bad.npy" in capsys.readouterr().err


def test_run_with_precision(tmp_path, capsys, rng):
    x = rng.random((1, 1, 10, 12), dtype=np.float32)
    np.save(tmp_path / "x.npy", x)
    outs = {}
    for prec in ("fp32", "int8"):
        d = tmp_path / prec
        assert main(["run", ESPCN, "--input", f"input={tmp_path / 'x.npy'}", "--output-dir", str(d),
                     "-q", "--precision", prec]) == 0
        outs[prec] = np.load(d / "output.npy")
    want = npurun.Executor("reference").run_sync(npurun.load(ESPCN), {"input": x})["output"]
    np.testing.assert_allclose(outs["fp32"], want, atol=1e-5)
    err = np.abs(outs["int8"] - want).max()
    assert 0 < err < 0.1, err  # int8 differs, but not wildly


def test_upscale_with_precision(tmp_path, capsys):
    from PIL import Image
    src = tmp_path / "small.png"
    Image.open(zoo.path("sample.jpg")).convert("RGB").crop((200, 100, 260, 140)).save(src)
    assert main(["upscale", str(src), "-o", str(tmp_path / "o.png"), "-q", "--precision", "fp16"]) == 0
    assert "precision fp16" in capsys.readouterr().out
    assert Image.open(tmp_path / "o.png").size == (180, 120)
