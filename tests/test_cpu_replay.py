"""Recorded runs (npurun/backends/cpu/replay.py): a short program's kernel calls recorded once
and replayed. Checked against the reference backend and against the program's own normal runs
(bit for bit), on fresh random inputs every run; and that what a replay cannot reproduce (a
step's own NumPy work, an argument read from the data, a kernel writing into its inputs, other
integer inputs) is caught and run as Python or not replayed at all."""
import threading

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import npurun
from npurun.backends import base
from npurun.backends.cpu import native, replay

from conftest import nonzero_normal

pytestmark = pytest.mark.skipif(not replay.enabled(), reason="replays need the compiled kernels and csrc/py/addr.c "
                                "(x86-64 System V)")


@pytest.fixture(autouse=True)
def _kept(monkeypatch):
    """A recording is kept whatever replays measure against normal runs (a timing: tests never
    depend on one); test_a_recording_slower_than_normal_runs_is_dropped checks that decision."""
    monkeypatch.setattr(replay, "_slower", lambda program, rec, feeds, stop=None: "")


def _model(tmp_path, rng, name="m"):
    """A small CNN-and-sequence mix: conv + relu, max pool, a transposed view reshaped (a copy),
    a broadcast add, a mul by a scalar, concat, a constant pad, a matmul by a constant and one
    of two computed operands, softmax; an int64 input gathers rows (an `exact` input)."""
    w = nonzero_normal(rng, (4, 3, 3, 3))
    b = nonzero_normal(rng, (4,))
    bias = nonzero_normal(rng, (4,))
    wm = nonzero_normal(rng, (4, 5))
    emb = nonzero_normal(rng, (10, 5))
    inits = [numpy_helper.from_array(a, n) for a, n in ((w, "w"), (b, "b"), (bias, "bias"), (wm, "wm"), (emb, "emb"))]
    inits += [numpy_helper.from_array(np.array([1, 16, 4], np.int64), "shp"),
              numpy_helper.from_array(np.array([0, 1, 0, 0, 2, 0], np.int64), "pads"),
              numpy_helper.from_array(np.array(0.5, np.float32), "half")]
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Transpose", ["p"], ["t"], perm=[0, 2, 3, 1]),
        helper.make_node("Reshape", ["t", "shp"], ["s"]),
        helper.make_node("Add", ["s", "bias"], ["a"]),
        helper.make_node("Mul", ["a", "half"], ["m"]),
        helper.make_node("Concat", ["m", "a"], ["cc"], axis=1),
        helper.make_node("Pad", ["cc", "pads"], ["pd"], mode="constant"),
        helper.make_node("MatMul", ["pd", "wm"], ["mm"]),
        helper.make_node("Gather", ["emb", "ids"], ["g"], axis=0),
        helper.make_node("Transpose", ["g"], ["gt"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["mm", "gt"], ["att"]),
        helper.make_node("Softmax", ["att"], ["y"], axis=-1),
    ]
    graph = helper.make_graph(nodes, name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8]),
                                            helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
                               helper.make_tensor_value_info("mm", TensorProto.FLOAT, None)], inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    p = tmp_path / f"{name}.onnx"
    onnx.save(m, p)
    return npurun.load(p)


def _feeds(rng, ids=(1, 4, 7)):
    return {"x": nonzero_normal(rng, (1, 3, 8, 8)), "ids": np.array([ids], np.int64)}


def _recording(prog):
    (s,) = prog._replays.signatures.values()
    return s


def _same_bits(a: dict, b: dict):
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape and a[k].tobytes() == b[k].tobytes(), k


@pytest.mark.parametrize("threads", [1, 2])
def test_replays_match_the_reference_and_the_programs_normal_runs_bit_for_bit(tmp_path, rng, threads):
    g = _model(tmp_path, rng)
    cpu, ref = npurun.Executor("cpu", parallelism=threads), npurun.Executor("reference")
    prog = cpu.compile(g)
    for i in range(8):  # warm-up (3), the recording, then replays
        f = _feeds(rng)
        got = prog.run(f)
        want = ref.run_sync(g, f)
        for k in want:
            np.testing.assert_allclose(got[k], want[k], rtol=1e-4, atol=1e-5)
        if i >= replay.WARM + 2:
            _same_bits(got, prog._run(f))  # a normal run of the recorded program: the same bits
    s = _recording(prog)
    assert s.recording is not None, s.never
    kinds = dict(zip([st[0].op for st in prog.steps], s.recording.kinds))
    # the kernels, copies and products are recorded calls (the gather reads this run's ids)
    for op in ("conv", "max_pool", "reshape", "add", "mul", "concat", "pad", "matmul", "softmax", "gather"):
        assert kinds.get(op) == "c", (op, kinds)
    assert kinds["transpose"] == "view"
    out = prog.run(_feeds(rng))
    out["y"][...] = 0  # a caller may write into what it gets: the next run is not touched
    f = _feeds(rng)
    np.testing.assert_allclose(prog.run(f)["y"], ref.run_sync(g, f)["y"], rtol=1e-4, atol=1e-5)


def test_ids_are_inputs_like_any_and_a_constant_integer_input_must_match(tmp_path, rng, monkeypatch):
    g = _model(tmp_path, rng)
    cpu, ref = npurun.Executor("cpu", parallelism=1), npurun.Executor("reference")
    prog = cpu.compile(g)
    for _ in range(replay.WARM + 2):
        prog.run(_feeds(rng))
    rec = _recording(prog).recording
    assert rec is not None and rec.exact == []  # ids shuffled in the check: any ids replay
    calls = []
    real = base.Program.run
    monkeypatch.setattr(base.Program, "run", lambda *a, **k: calls.append(1) or real(*a, **k))
    for ids in ((9, 0, 3), (2, 2, 5)):
        f = _feeds(rng, ids=ids)
        want = ref.run_sync(g, f)["y"]
        calls.clear()
        np.testing.assert_allclose(prog.run(f)["y"], want, rtol=1e-4, atol=1e-5)
        assert calls == []  # a replay, with this run's ids
    # an integer input whose values are all one (a sample rate): required equal, else a normal run
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])
    k = helper.make_tensor_value_info("k", TensorProto.INT64, [])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    nodes = [helper.make_node("Cast", ["k"], ["kf"], to=TensorProto.FLOAT), helper.make_node("Mul", ["x", "kf"], ["y"])]
    onnx.save(helper.make_model(helper.make_graph(nodes, "k", [x, k], [y]), opset_imports=[helper.make_opsetid("", 17)]),
              tmp_path / "k.onnx")
    prog = cpu.compile(npurun.load(tmp_path / "k.onnx"))
    for _ in range(replay.WARM + 2):
        prog.run({"x": nonzero_normal(rng, (4, 8)), "k": np.array(3)})
    rec = _recording(prog).recording
    assert rec is not None and [nm for nm, _ in rec.exact] == ["k"]
    xs = nonzero_normal(rng, (4, 8))
    calls.clear()
    np.testing.assert_array_equal(prog.run({"x": xs, "k": np.array(5)})["y"], xs * 5)
    assert calls == [1]  # another sample rate: a normal run
    calls.clear()
    np.testing.assert_array_equal(prog.run({"x": xs, "k": np.array(3)})["y"], xs * 3)
    assert calls == []


def _relu_program(tmp_path, rng, threads=1):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 128])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Sigmoid", ["r"], ["y"])]
    m = helper.make_model(helper.make_graph(nodes, "r", [x], [y]), opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(m, tmp_path / "r.onnx")
    return npurun.Executor("cpu", parallelism=threads).compile(npurun.load(tmp_path / "r.onnx"))


def _wrap_first(prog, wrapper):
    n, fn, attrs, dead = prog.steps[0]
    prog.steps = [(n, wrapper(fn), attrs, dead)] + list(prog.steps[1:])


def _sigmoid(v):
    return 1 / (1 + np.exp(-v.astype(np.float64)))


def test_a_steps_own_numpy_work_is_caught_and_run_as_python(tmp_path, rng):
    prog = _relu_program(tmp_path, rng)
    # the step calls the compiled relu, then does NumPy work of its own on the result
    _wrap_first(prog, lambda fn: (lambda x, **a: fn(x, **a) * np.float32(2)))
    for _ in range(replay.WARM + 2):  # warm-up, one run on the kernels a replay takes, the recording
        prog.run({"x": nonzero_normal(rng, (64, 128))})
    rec = _recording(prog).recording
    assert rec is not None and rec.kinds == ["py", "c"]
    for _ in range(3):
        x = nonzero_normal(rng, (64, 128))
        np.testing.assert_allclose(prog.run({"x": x})["y"], _sigmoid(np.maximum(x, 0) * 2), rtol=1e-5, atol=1e-6)


def test_an_argument_read_from_the_data_is_caught(tmp_path, rng):
    prog = _relu_program(tmp_path, rng)

    def scaled(fn):  # leaky relu whose slope is the data's own maximum (a value only this run has)
        def run(x, **a):
            y = np.empty_like(x)
            native.LIB.npr_activation(native.ptr(x), native.ptr(y), x.size, native.ACTS["leaky_relu"],
                                      float(np.abs(x).max()) / 100, 0.0)
            return y
        return run
    _wrap_first(prog, scaled)
    for _ in range(replay.WARM + 2):  # warm-up, one run on the kernels a replay takes, the recording
        prog.run({"x": nonzero_normal(rng, (64, 128))})
    rec = _recording(prog).recording
    assert rec is not None and rec.kinds == ["py", "c"]
    x = nonzero_normal(rng, (64, 128))
    s = np.abs(x).max() / 100
    np.testing.assert_allclose(prog.run({"x": x})["y"], _sigmoid(np.where(x > 0, x, s * x)), rtol=1e-5, atol=1e-6)


def test_a_kernel_writing_into_its_input_is_never_replayed(tmp_path, rng):
    prog = _relu_program(tmp_path, rng)

    def in_place(fn):  # a cache updated in place: the caller's array changes
        def run(x, **a):
            y = fn(x, **a)
            x += 1
            return y
        return run
    _wrap_first(prog, in_place)
    for _ in range(5):
        x = nonzero_normal(rng, (64, 128))
        x0 = x.copy()
        prog.run({"x": x})
        np.testing.assert_array_equal(x, x0 + 1)  # every run, replayed or not, writes the caller's array
    s = _recording(prog)
    assert s.recording is None and "writes into its inputs" in s.never


def test_long_runs_and_wrapped_steps_are_not_replayed(tmp_path, rng, monkeypatch):
    prog = _relu_program(tmp_path, rng)
    monkeypatch.setattr(replay, "MAX_SECONDS", 0.0)
    for _ in range(replay.WARM + 2):
        prog.run({"x": nonzero_normal(rng, (64, 128))})
    assert _recording(prog).recording is None and "recorded below" in _recording(prog).never
    monkeypatch.undo()
    prog = _relu_program(tmp_path, rng)
    for _ in range(replay.WARM + 2):
        prog.run({"x": nonzero_normal(rng, (64, 128))})
    assert _recording(prog).recording is not None
    seen = []
    _wrap_first(prog, lambda fn: (lambda x, **a: seen.append(1) or fn(x, **a)))  # (a profiler's wrapper)
    x = nonzero_normal(rng, (64, 128))
    np.testing.assert_allclose(prog.run({"x": x})["y"], _sigmoid(np.maximum(x, 0)), rtol=1e-5, atol=1e-6)
    assert seen == [1] and "replaced" in _recording(prog).never


def test_a_run_with_progress_runs_its_steps(tmp_path, rng):
    prog = _relu_program(tmp_path, rng)
    for _ in range(replay.WARM + 2):
        prog.run({"x": nonzero_normal(rng, (64, 128))})
    assert _recording(prog).recording is not None
    steps = []
    prog.run({"x": nonzero_normal(rng, (64, 128))}, progress=lambda i, n, label: steps.append(i))
    assert steps == [1, 2]
    attention = [True]  # the scheduler's flag raised: a boundary is due, so no replay
    prog.run({"x": nonzero_normal(rng, (64, 128))}, progress=lambda i, n, label: steps.append(i), attention=attention)
    assert steps == [1, 2, 1, 2]


def test_a_flag_raised_during_a_replay_gets_the_boundary_between_segments(tmp_path, rng):
    prog = _relu_program(tmp_path, rng)
    attention = [False]

    def raising(fn):  # a Python step (its own NumPy work) during which a better task arrives
        def run(x, **a):
            attention[0] = fired[0]
            return fn(x, **a) * np.float32(2)
        return run
    fired = [False]
    _wrap_first(prog, raising)
    for _ in range(replay.WARM + 2):
        prog.run({"x": nonzero_normal(rng, (64, 128))})
    rec = _recording(prog).recording
    assert rec is not None and rec.kinds == ["py", "c"]
    seen = []
    fired[0] = True
    x = nonzero_normal(rng, (64, 128))
    y = prog.run({"x": x}, progress=lambda i, n, label: seen.append(i), attention=attention)["y"]
    np.testing.assert_allclose(y, _sigmoid(np.maximum(x, 0) * 2), rtol=1e-5, atol=1e-6)
    assert seen == [1, 2]  # (a replay: the boundary after each segment once the flag is up)


def test_two_threads_running_one_program_get_their_own_results(tmp_path, rng):
    g = _model(tmp_path, rng)
    cpu, ref = npurun.Executor("cpu", parallelism=1), npurun.Executor("reference")
    prog = cpu.compile(g)
    for _ in range(replay.WARM + 2):
        prog.run(_feeds(rng))
    feeds = [[_feeds(np.random.default_rng(int(rng.integers(1 << 30)))) for _ in range(30)] for _ in range(2)]
    got = [[], []]

    def worker(k):
        for f in feeds[k]:
            got[k].append(prog.run(f)["y"])
    ts = [threading.Thread(target=worker, args=(k,)) for k in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    for k in range(2):
        for f, y in zip(feeds[k], got[k]):
            np.testing.assert_allclose(y, ref.run_sync(g, f)["y"], rtol=1e-4, atol=1e-5)


def test_replays_off_by_environment(tmp_path, rng, monkeypatch):
    monkeypatch.setenv("NPURUN_REPLAY", "0")
    assert _relu_program(tmp_path, rng)._replays is None


def _strided(rng, shape, dtype):
    """A random array of `shape`, as a view of a larger one in some other axis order,
    sometimes reversed along an axis."""
    perm = rng.permutation(len(shape))
    base = nonzero_normal(rng, tuple(np.array(shape)[perm]) if shape else ()).astype(dtype)
    x = np.transpose(base, np.argsort(perm)) if shape else base
    if shape and rng.random() < 0.3:
        x = np.flip(x, axis=int(rng.integers(len(shape))))
    return x


def test_the_copy_and_binary_kernels_equal_numpy_bit_for_bit(rng):
    ops = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide,
           "max": np.maximum, "min": np.minimum}
    for _ in range(200):
        nd = int(rng.integers(0, 5))
        shape = tuple(int(d) for d in rng.integers(1, 6, nd))
        bshape = tuple(d if rng.random() < 0.6 else 1 for d in shape)[int(rng.integers(0, nd + 1)):]
        a, b = _strided(rng, shape, np.float32), _strided(rng, bshape, np.float32)
        if a.size and rng.random() < 0.2:
            a = a.copy()
            a.flat[int(rng.integers(a.size))] = np.nan
        for op, f in ops.items():
            want = f(a, b)
            for threads in (1, 2, 3):  # (npr_binary_mt: rows, or a few long rows' columns, a part)
                y = native.binary(op, a, b, threads)
                assert y.shape == want.shape and y.tobytes() == want.tobytes(), (op, a.shape, b.shape, a.strides, threads)
        for dtype in (np.float32, np.int64, np.uint8, np.float16):
            x = _strided(rng, bshape, dtype)
            y = np.empty(shape, dtype)
            assert native.copy_into(y, x)
            np.testing.assert_array_equal(y, np.broadcast_to(x, shape))
    for shape, bshape in (((1, 1000), (1000,)), ((3, 777), (3, 1)), ((2, 96, 40, 40), (1, 96, 1, 1)), ((70000,), (1,))):
        a, b = _strided(rng, shape, np.float32), _strided(rng, bshape, np.float32)
        for op, f in ops.items():
            for threads in (2, 3):
                assert native.binary(op, a, b, threads).tobytes() == f(a, b).tobytes(), (op, shape, bshape, threads)
    x = nonzero_normal(rng, (4, 5))
    assert not native.copy_into(x[1:], x[:-1])  # overlapping: refused (NumPy's to do)


def test_the_unary_kernel_matches_numpy(rng):
    """Exact where NumPy's is (sqrt, reciprocal, neg, abs, floor, ceil: bit for bit); libm's
    exp, log, sin, cos within a few ulps of NumPy's own."""
    x = _strided(rng, (3, 7, 5), np.float32) * 3
    pos = np.abs(x) + np.float32(0.1)
    for op, f in {"sqrt": np.sqrt, "reciprocal": lambda v: 1 / v, "neg": np.negative, "abs": np.abs,
                  "floor": np.floor, "ceil": np.ceil}.items():
        v = pos if op == "sqrt" else x
        assert native.unary(op, v).tobytes() == f(v).tobytes(), op
    for op, f in {"exp": np.exp, "log": np.log, "sin": np.sin, "cos": np.cos}.items():
        v = pos if op == "log" else x
        np.testing.assert_allclose(native.unary(op, v), f(v.astype(np.float64)), rtol=3e-7, atol=1e-7, err_msg=op)


def test_a_recording_slower_than_normal_runs_is_dropped(tmp_path, rng, monkeypatch):
    monkeypatch.undo()  # (the real decision, on a fake clock: replays take 200 us, normal runs 100)
    clock = [0.0]

    class FakeTime:
        @staticmethod
        def perf_counter():
            return clock[0]
    prog = _relu_program(tmp_path, rng)
    real_run, real_replay = prog._run, replay.Recording.run

    def normal(*a, **k):
        clock[0] += 1e-4
        return real_run(*a, **k)

    def replayed(self, *a, **k):
        clock[0] += 2e-4
        return real_replay(self, *a, **k)
    monkeypatch.setattr(replay, "time", FakeTime)
    monkeypatch.setattr(prog, "_run", normal)
    monkeypatch.setattr(replay.Recording, "run", replayed)
    for _ in range(replay.WARM + 2):
        x = nonzero_normal(rng, (64, 128))
        np.testing.assert_allclose(prog.run({"x": x})["y"], _sigmoid(np.maximum(x, 0)), rtol=1e-5, atol=1e-6)
    s = _recording(prog)
    assert s.recording is None and s.never.startswith("replays took") and not prog._cheap
    monkeypatch.setattr(replay.Recording, "run", lambda self, *a, **k: (clock.__setitem__(0, clock[0] + 0.5e-4),
                                                                        real_replay(self, *a, **k))[1])
    prog = _relu_program(tmp_path, rng)
    monkeypatch.setattr(prog, "_run", normal)
    for _ in range(replay.WARM + 2):
        prog.run({"x": nonzero_normal(rng, (64, 128))})
    assert _recording(prog).recording is not None and _recording(prog).recording.speedup == pytest.approx(2.0)


def _if_model(tmp_path, name, cond_nodes):
    """y = if cond: relu(x) * 2 + 1 else: -x, the condition made by `cond_nodes` (-> c); x's
    first axis symbolic (so a shape chain stays in the program compiled without shapes)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    two = helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])
    one = helper.make_tensor("one", TensorProto.FLOAT, [], [1.0])
    then = helper.make_graph([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Mul", ["r", "two"], ["m"]),
                              helper.make_node("Add", ["m", "one"], ["t"])], "then", [],
                             [helper.make_tensor_value_info("t", TensorProto.FLOAT, None)], [two, one])
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [],
                              [helper.make_tensor_value_info("e", TensorProto.FLOAT, None)])
    nodes = cond_nodes + [helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)]
    inits = [numpy_helper.from_array(np.array([0], np.int64), "i0"), numpy_helper.from_array(np.array([4], np.int64), "n4"),
             numpy_helper.from_array(np.array(0.0, np.float32), "zero")]
    m = helper.make_model(helper.make_graph(nodes, name, [x], [y], inits), opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(m, tmp_path / f"{name}.onnx")
    return npurun.load(tmp_path / f"{name}.onnx")


def test_an_if_on_a_shape_is_recorded_step_by_step_and_one_on_the_data_stays_correct(tmp_path, rng):
    ref = npurun.Executor("reference")
    # the condition from the input's shape (Shape -> Gather -> Equal): fixed for the signature
    g = _if_model(tmp_path, "shape_if", [helper.make_node("Shape", ["x"], ["s"]),
                                         helper.make_node("Gather", ["s", "i0"], ["s0"], axis=0),
                                         helper.make_node("Equal", ["s0", "n4"], ["c1"]),
                                         helper.make_node("Squeeze", ["c1"], ["c"])])
    prog = npurun.Executor("cpu", parallelism=1).compile(g)
    for _ in range(replay.WARM + 4):
        x = nonzero_normal(rng, (4, 8))
        np.testing.assert_allclose(prog.run({"x": x})["y"], ref.run_sync(g, {"x": x})["y"], rtol=1e-6, atol=1e-6)
    rec = _recording(prog).recording
    assert rec is not None and "guard" in rec.kinds and rec.kinds.count("const") >= 3
    # (the shape chain fixed; the branch's step, the passes' fused affine + relu, a recorded
    # call after the guard; the if's output an alias of the branch's)
    assert rec.kinds[rec.kinds.index("guard") + 1:] == ["c", "view"]
    # the condition from the data: whichever branch a run takes, its answer is the reference's
    g = _if_model(tmp_path, "data_if", [helper.make_node("ReduceSum", ["x"], ["sum"], keepdims=0),
                                        helper.make_node("Greater", ["sum", "zero"], ["c"])])
    prog = npurun.Executor("cpu", parallelism=1).compile(g)
    for shift in [10.0] * (replay.WARM + 3) + [-10.0, 10.0, -10.0]:  # (the check's noise cannot flip a sum of ~320)
        x = nonzero_normal(rng, (4, 8)) + np.float32(shift)
        np.testing.assert_allclose(prog.run({"x": x})["y"], ref.run_sync(g, {"x": x})["y"], rtol=1e-6, atol=1e-6)
    assert "guard" in _recording(prog).recording.kinds  # recorded on the then-branch, guarded


def test_a_data_dependent_if_gets_a_recording_per_branch(tmp_path, rng):
    """Each way through an if on the data is recorded when first taken; then a run replays
    whichever its data takes (a replay that reaches the other branch hands over to the other
    recording), and no run is a normal one."""
    ref = npurun.Executor("reference")
    g = _if_model(tmp_path, "ways", [helper.make_node("ReduceSum", ["x"], ["sum"], keepdims=0),
                                     helper.make_node("Greater", ["sum", "zero"], ["c"])])
    prog = npurun.Executor("cpu", parallelism=1).compile(g)

    def run(shift):  # (the check's noise cannot flip a sum of ~320)
        x = nonzero_normal(rng, (4, 8)) + np.float32(shift)
        np.testing.assert_allclose(prog.run({"x": x})["y"], ref.run_sync(g, {"x": x})["y"], rtol=1e-6, atol=1e-6)
    for shift in [10.0] * (replay.WARM + 2) + [-10.0] * 2:
        run(shift)
    s = _recording(prog)
    assert s.recording is not None and len(s.others) == 1
    ways = {tuple(e[6] for e in r.plan if e[0] == replay._GUARD) for r in [s.recording, *s.others]}
    assert ways == {(True,), (False,)}
    normal, real = [], prog._run
    prog._run = lambda *a, **k: normal.append(1) or real(*a, **k)
    for shift in (10.0, -10.0, -10.0, 10.0, -10.0):
        run(shift)
    assert not normal


def test_a_flag_raised_during_a_recording_stops_it_until_a_quiet_run(tmp_path, rng):
    prog = _relu_program(tmp_path, rng)
    attention, raise_it = [False], [False]

    def raising(fn):
        def run(x, **a):
            attention[0] = attention[0] or raise_it[0]
            return fn(x, **a)
        return run
    _wrap_first(prog, raising)
    quiet = {"progress": lambda i, n, label: None, "attention": attention}
    for _ in range(replay.WARM + 1):
        prog.run({"x": nonzero_normal(rng, (64, 128))}, **quiet)
    raise_it[0] = True  # a better task arrives during the recording's run
    x = nonzero_normal(rng, (64, 128))
    np.testing.assert_allclose(prog.run({"x": x}, **quiet)["y"], _sigmoid(np.maximum(x, 0)), rtol=1e-5, atol=1e-6)
    s = _recording(prog)
    assert s.recording is None and s.never == ""  # stopped, to be tried again
    raise_it[0], attention[0] = False, False
    prog.run({"x": nonzero_normal(rng, (64, 128))}, **quiet)
    assert _recording(prog).recording is not None


def test_sequence_outputs_stay_sequences(tmp_path, rng):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [6, 4])
    seq = helper.make_tensor_sequence_value_info("parts", TensorProto.FLOAT, None)
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("SplitToSequence", ["r"], ["parts"], axis=0)]
    onnx.save(helper.make_model(helper.make_graph(nodes, "s", [x], [seq]), opset_imports=[helper.make_opsetid("", 17)]),
              tmp_path / "s.onnx")
    prog = npurun.Executor("cpu", parallelism=1).compile(npurun.load(tmp_path / "s.onnx"))
    for _ in range(replay.WARM + 4):
        x = nonzero_normal(rng, (6, 4))
        parts = prog.run({"x": x})["parts"]
        assert isinstance(parts, list) and len(parts) == 6
        np.testing.assert_array_equal(np.concatenate(parts), np.maximum(x, 0))
