"""The `npurun` command as a user runs it: results, and one clear line on bad input."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import npurun
from npurun import zoo

NPURUN = [sys.executable, "-m", "npurun"]


def run(*args, cwd=None):
    env = {**os.environ, "NPURUN_DEBUG": ""}
    return subprocess.run(NPURUN + [str(a) for a in args], capture_output=True, text=True, cwd=cwd, env=env, timeout=300)


def assert_clean_failure(r, *words):
    assert r.returncode != 0
    assert "Traceback" not in r.stderr and "Traceback" not in r.stdout
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("npurun: error: "), r.stderr
    for w in words:
        assert w in lines[0], (w, lines[0])


def test_console_script_is_installed():
    exe = shutil.which("npurun", path=str(Path(sys.executable).parent))
    assert exe, "the npurun console script is missing from the environment"
    r = subprocess.run([exe, "--version"], capture_output=True, text=True)
    assert r.returncode == 0 and npurun.__version__ in r.stdout


def test_info_lists_backends():
    r = run("info")
    assert r.returncode == 0
    assert "reference  available" in r.stdout and "cpu        available" in r.stdout


def test_upscale_colour_photo(tmp_path, rng):
    src = tmp_path / "in.png"
    Image.fromarray(rng.integers(0, 256, (21, 30, 3), dtype=np.uint8)).save(src)
    r = run("upscale", src, "-o", tmp_path / "out.png", "--device", "reference")
    assert r.returncode == 0, r.stderr
    out = Image.open(tmp_path / "out.png")
    assert out.size == (90, 63) and out.mode == "RGB"
    assert "in.png (30x21) -> " in r.stdout and " s on reference" in r.stdout


def test_upscale_grayscale_and_alpha(tmp_path, rng):
    for mode, shape in (("L", (16, 12)), ("RGBA", (16, 12, 4))):
        src = tmp_path / f"in_{mode}.png"
        Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8), mode).save(src)
        r = run("upscale", src, "-o", tmp_path / f"out_{mode}.png")
        assert r.returncode == 0, r.stderr
        out = Image.open(tmp_path / f"out_{mode}.png")
        assert out.size == (36, 48) and out.mode == mode


def test_convert_run_and_ir_commands(tmp_path, rng):
    model = zoo.path("espcn_x3.onnx")
    r = run("convert", model, "-o", tmp_path / "espcn.npuir")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "espcn.npuir").exists() and (tmp_path / "espcn.weights.npz").exists()
    r = run("ir", "verify", tmp_path / "espcn.npuir")
    assert r.returncode == 0 and ": ok (6 nodes" in r.stdout
    r = run("ir", "print", tmp_path / "espcn.npuir")
    assert r.returncode == 0 and "op depth_to_space" in r.stdout and "[1, 1, 3*H, 3*W]" in r.stdout
    x = rng.random((1, 1, 10, 12), dtype=np.float32)
    np.save(tmp_path / "x.npy", x)
    outs = []
    for m in (model, tmp_path / "espcn.npuir"):
        d = tmp_path / f"out_{Path(m).suffix[1:]}"
        r = run("run", m, "--input", f"input={tmp_path / 'x.npy'}", "--output-dir", d)
        assert r.returncode == 0, r.stderr
        assert "output: float32 [1, 1, 30, 36]" in r.stdout
        outs.append(np.load(d / "output.npy"))
    np.testing.assert_array_equal(outs[0], outs[1])


def test_bad_inputs_give_one_line_and_write_nothing(tmp_path, rng):
    model = zoo.path("espcn_x3.onnx")
    notimg = tmp_path / "notes.png"
    notimg.write_text("this is not an image")
    out = tmp_path / "o.png"
    assert_clean_failure(run("upscale", notimg, "-o", out), str(notimg), "not an image")
    trunc = tmp_path / "trunc.png"
    good = tmp_path / "good.png"
    Image.fromarray(rng.integers(0, 256, (40, 40, 3), dtype=np.uint8)).save(good)
    trunc.write_bytes(good.read_bytes()[:200])
    assert_clean_failure(run("upscale", trunc, "-o", out), str(trunc), "cannot decode")
    assert_clean_failure(run("upscale", good, "-o", tmp_path / "o.xyz"), "unknown output format '.xyz'")
    assert_clean_failure(run("upscale", good, "-o", out, "--scale", "2"), "upscales by 3, --scale 2")
    assert_clean_failure(run("upscale", tmp_path / "missing.png", "-o", out), "missing.png: no such file")
    bad_model = tmp_path / "bad.onnx"
    bad_model.write_bytes(model.read_bytes()[:1000])
    assert_clean_failure(run("run", bad_model, "--input", "input=x.npy"), str(bad_model), "not a valid ONNX model")
    assert_clean_failure(run("convert", bad_model, "-o", tmp_path / "b.npuir"), "not a valid ONNX model")
    bad_ir = tmp_path / "bad.npuir"
    bad_ir.write_text("npuir 1\nop relu (a: [2] f32 -> b: [2] f32\n")
    assert_clean_failure(run("ir", "verify", bad_ir), f"{bad_ir}:2:")
    np.save(tmp_path / "x.npy", rng.random((1, 1, 4, 4), dtype=np.float32))
    np.save(tmp_path / "x64.npy", rng.random((1, 1, 4, 4)))
    np.save(tmp_path / "x3.npy", rng.random((1, 4, 4), dtype=np.float32))
    assert_clean_failure(run("run", model, "--input", f"image={tmp_path / 'x.npy'}"), "unknown input name(s) 'image'")
    assert_clean_failure(run("run", model, "--input", f"input={tmp_path / 'x64.npy'}"), "dtype float64, expected float32")
    assert_clean_failure(run("run", model, "--input", f"input={tmp_path / 'x3.npy'}"), "shape [1, 4, 4], expected [1, 1, H, W]")
    assert_clean_failure(run("run", model, "--input", f"input={tmp_path / 'nope.npy'}"), "nope.npy: no such file")
    assert_clean_failure(run("run", model, "--input", "input"), "expected NAME=FILE.npy")
    assert_clean_failure(run("upscale", good, "-o", out, "--device", "quantum"), "unknown device 'quantum'")
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no temp files left


def test_usage_error_exits_2():
    r = run("upscale")
    assert r.returncode == 2 and "Traceback" not in r.stderr


def test_ops_report_explains_every_node(tmp_path, rng):
    from onnx import TensorProto, helper, numpy_helper, save
    w = numpy_helper.from_array(nonzero(rng, (4, 2, 3, 3)), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="dense", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"], name="act"),
             helper.make_node("Conv", ["r", "dw"], ["d"], name="depthwise", group=4),
             helper.make_node("Sigmoid", ["d"], ["y"], name="gate")]
    dw = numpy_helper.from_array(nonzero(rng, (4, 1, 3, 3)), "dw")
    g = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w, dw])
    save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "m.onnx")
    r = run("ops-report", tmp_path / "m.onnx")
    assert r.returncode == 0, r.stderr
    rows = {line.split()[1]: line for line in r.stdout.splitlines()[1:-1]}
    assert set(rows) == {"dense", "act", "depthwise", "gate"}
    backend = {k: v.split()[3] for k, v in rows.items()}
    assert "fused into node 'dense'" in rows["act"]
    from npurun.backends.cpu import native
    assert "fused into node 'depthwise'" in rows["gate"] and "sigmoid in its epilogue" in rows["depthwise"]
    if native.LIB is not None:  # the compiled kernels take depthwise convs
        assert backend == {"dense": "cpu", "act": "-", "depthwise": "cpu", "gate": "-"}
        assert r.stdout.splitlines()[-1] == "4 nodes on cpu: cpu 2, passes 2; 2 after the pass pipeline"
    else:
        assert backend == {"dense": "cpu", "act": "-", "depthwise": "reference", "gate": "-"}
        assert "grouped or depthwise convolution" in rows["depthwise"].lower()
        assert r.stdout.splitlines()[-1] == "4 nodes on cpu: cpu 2, reference 2"
    r = run("ops-report", tmp_path / "m.onnx", "--device", "reference")
    assert r.stdout.splitlines()[-1] == "4 nodes on reference: reference 4; 4 after the pass pipeline"


def nonzero(rng, shape):
    from conftest import nonzero_normal
    return nonzero_normal(rng, shape)


def test_outputs_get_the_usual_file_permissions(tmp_path, rng):
    src = tmp_path / "in.png"
    Image.fromarray(rng.integers(0, 256, (9, 9, 3), dtype=np.uint8)).save(src)
    assert run("upscale", src, "-o", tmp_path / "out.png").returncode == 0
    umask = os.umask(0)
    os.umask(umask)
    assert (tmp_path / "out.png").stat().st_mode & 0o777 == 0o666 & ~umask
