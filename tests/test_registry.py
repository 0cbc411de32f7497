"""npurun.register_op: a registered op imports from ONNX (any domain), prints and parses in
.npuir text, is seen by passes through its groups, is costed by npurun.ir.cost and npusim, runs
on the reference, cpu and torch backends; bad specs are refused naming the op and the field."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import npurun
from npurun.errors import ModelError, RegistrationError
from npurun.ir.ops import OPS
from npurun.registry import registered_ops, unregister_op

DOMAIN = "test.ops"


def _scaled_tanh(x, *, alpha, beta):
    return (alpha * np.tanh(beta * x.astype(np.float64))).astype(x.dtype)


def _scaled_tanh_cpu(x, *, alpha, beta):
    _scaled_tanh_cpu.calls += 1
    return (np.float32(alpha) * np.tanh(np.float32(beta) * x)).astype(x.dtype)


_scaled_tanh_cpu.calls = 0


@pytest.fixture
def registered():
    """Registers ops under DOMAIN for one test and removes them after it."""
    before = set(registered_ops())
    yield npurun.register_op
    for name in set(registered_ops()) - before:
        unregister_op(name)


def _model(nodes, inputs, outputs, opsets=((DOMAIN, 1),), inits=()):
    g = helper.make_graph(nodes, "m", inputs, outputs, initializer=list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]
                             + [helper.make_opsetid(d, v) for d, v in opsets])


def _tanh_model(tmp_path, **attrs):
    node = helper.make_node("ScaledTanh", ["x"], ["y"], domain=DOMAIN, name="st", **attrs)
    m = _model([node], [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 5])],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 5])])
    path = tmp_path / "st.onnx"
    onnx.save(m, path)
    return path


def _register_tanh(reg, **kw):
    spec = dict(domain=DOMAIN, attrs={"alpha": 1.0, "beta": 1.0}, groups={"elementwise", "unary"},
                macs=2, reference=_scaled_tanh)
    spec.update(kw)
    return reg("scaled_tanh", **spec)


def _x(shape=(3, 5), seed=0):
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    assert np.all(x != 0)
    return x


def test_onnx_import_runs_on_reference_and_cpu(registered, tmp_path):
    rec = _register_tanh(registered, cpu=_scaled_tanh_cpu)
    assert rec.name == "test.ops.scaled_tanh" and rec.onnx_op == "ScaledTanh"
    assert rec.kernels == ("reference", "cpu")
    path = _tanh_model(tmp_path, alpha=2.0, beta=0.5)
    x = _x()
    want = 2.0 * np.tanh(0.5 * x.astype(np.float64))
    g = npurun.load(path)
    assert [n.op for n in g.nodes] == ["test.ops.scaled_tanh"]
    calls = _scaled_tanh_cpu.calls
    for device in ("reference", "cpu"):
        (y,) = npurun.InferenceSession(path, device=device).run(None, {"x": x})
        np.testing.assert_allclose(y, want, rtol=1e-6, atol=1e-6)
    assert _scaled_tanh_cpu.calls == calls + 1  # the cpu backend ran the cpu kernel, once


def test_ops_report_names_cpu_kernel_or_the_fallback(registered, tmp_path, capsys):
    from npurun.cli import main
    path = _tanh_model(tmp_path)
    _register_tanh(registered)
    assert main(["ops-report", str(path), "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    row = next(ln for ln in out.splitlines() if "test.ops.scaled_tanh" in ln)
    assert "reference" in row and "no kernel of its own" in row
    _register_tanh(registered, cpu=_scaled_tanh_cpu, replace=True)
    assert main(["ops-report", str(path), "--device", "cpu"]) == 0
    row = next(ln for ln in capsys.readouterr().out.splitlines() if "test.ops.scaled_tanh" in ln)
    assert row.split()[3] == "cpu"


def test_npuir_text_round_trip(registered, tmp_path):
    _register_tanh(registered)
    g = npurun.load(_tanh_model(tmp_path, alpha=3.0))
    text = npurun.print_graph(g)
    assert "op test.ops.scaled_tanh @st (x: [N, 5] f32 DRAM0 -> y: [N, 5] f32 DRAM0) alpha=3.0" in text
    assert npurun.parse(text) == g
    # and a node written by hand, with a precision suffix
    g2 = npurun.parse("npuir 1\ngraph h\ninput x: [4] f32 DRAM0\n"
                      "op test.ops.scaled_tanh_f16 (x: [4] f32 DRAM0 -> y: [4] f32 DRAM0) beta=2.0\n")
    assert g2.nodes[0].op == "test.ops.scaled_tanh" and g2.nodes[0].precision == "f16"
    with pytest.raises(npurun.NpurunError, match="test.ops.scaled_tanh has no attribute 'gamma'"):
        npurun.parse("npuir 1\ngraph h\ninput x: [4] f32 DRAM0\n"
                     "op test.ops.scaled_tanh (x: [4] f32 DRAM0 -> y: [4] f32 DRAM0) gamma=2.0\n")


def test_passes_see_the_groups(registered):
    """split_bands carries band-local nodes through a conv chain: an elementwise op is one,
    the same op registered without the group is not."""
    from npurun.passes.split_bands import band_local
    text = ("npuir 1\ngraph c\ninput x: [1, 2, 8, 8] f32 DRAM0\n"
            "op test.ops.scaled_tanh (x: [1, 2, 8, 8] f32 DRAM0 -> y: [1, 2, 8, 8] f32 DRAM0)\n")
    _register_tanh(registered)
    g = npurun.parse(text)
    assert band_local(g.nodes[0], g.values)
    _register_tanh(registered, groups={"unary"}, replace=True)
    assert not band_local(g.nodes[0], g.values)


def test_cost_and_npusim(registered):
    from npurun.backends.npusim.simulate import estimate
    from npurun.ir.cost import node_costs

    def gather_rows(table, idx):
        return table[idx]

    def rows_rule(ins, a):
        return [((*ins[1].shape, ins[0].shape[1]), ins[0].dtype)]

    # bytes: a lookup reads only the rows it gathers, not the whole table
    registered("row_lookup", domain=DOMAIN, inputs=["table", "idx"], shape=rows_rule,
               bytes=lambda a, ins, outs: 2 * 4 * np.prod(outs[0][0]) + 8 * np.prod(ins[1][0]),
               reference=gather_rows)
    registered("dense", domain=DOMAIN, inputs=["x", "w"], unit="matrix", groups={"mac"},
               shape=lambda ins, a: [((ins[0].shape[0], ins[1].shape[1]), "f32")],
               macs=lambda a, ins, outs: ins[0][0] * ins[0][1] * ins[1][1], reference=np.matmul)
    _register_tanh(registered)
    g = npurun.parse(
        "npuir 1\ngraph c\ninput t: [1000, 64] f32 DRAM0\ninput i: [16] i64 DRAM0\n"
        "input w: [64, 32] f32 DRAM0\n"
        "op test.ops.row_lookup (t: [1000, 64] f32 DRAM0, i: [16] i64 DRAM0 -> r: [16, 64] f32 DRAM0)\n"
        "op test.ops.dense (r: [16, 64] f32 DRAM0, w: [64, 32] f32 DRAM0 -> d: [16, 32] f32 DRAM0)\n"
        "op test.ops.scaled_tanh (d: [16, 32] f32 DRAM0 -> y: [16, 32] f32 DRAM0)\n")
    costs = node_costs(g, {})
    assert [c.macs for c in costs] == [0, 16 * 64 * 32, 2 * 16 * 32]
    assert costs[0].bytes == 2 * 4 * 16 * 64 + 8 * 16  # the rule, not the 256 KB table
    assert costs[2].bytes == 2 * 4 * 16 * 32
    rep = estimate(g, "x-elite-hexagon", {})
    lookup, dense, tanh = rep.nodes
    assert dense.unit == "hmx" and dense.macs == 16 * 64 * 32  # the matrix unit
    assert tanh.unit == "hvx" and tanh.vector_work == 2 * 16 * 32  # its MACs on the vectors
    assert lookup.unit == "hvx" and lookup.sram_bytes + lookup.dram_bytes < 20_000


def test_torch_kernel(registered, tmp_path):
    torch = pytest.importorskip("torch")
    calls = []

    def torch_kernel(x, *, alpha, beta):
        calls.append(1)
        return alpha * torch.tanh(beta * x)
    _register_tanh(registered, torch=torch_kernel)
    g = npurun.load(_tanh_model(tmp_path, alpha=2.0, beta=0.5))
    x = _x()
    y = npurun.Executor(device="torch:cpu").run_sync(g, {"x": x})["y"]
    np.testing.assert_allclose(y, 2.0 * np.tanh(0.5 * x), rtol=1e-6, atol=1e-6)
    assert calls


def test_custom_op_decorator_and_variadic_optional(registered):
    @npurun.custom_op("weighted_sum", domain=DOMAIN, inputs=["w?", "xs*"], shape="broadcast",
                      groups={"elementwise"})
    def weighted_sum(w, *xs):
        total = sum(x.astype(np.float64) for x in xs)
        return (total if w is None else total * w).astype(xs[0].dtype)
    assert weighted_sum.op.name == "test.ops.weighted_sum"
    a, b = _x((2, 3), 1), _x((1, 3), 2)
    node = helper.make_node("WeightedSum", ["", "a", "b"], ["y"], domain=DOMAIN)
    m = _model([node], [helper.make_tensor_value_info("a", TensorProto.FLOAT, [2, 3]),
                        helper.make_tensor_value_info("b", TensorProto.FLOAT, [1, 3])],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    g = npurun.load(_save(m))
    assert g.values["y"].shape == (2, 3)
    y = npurun.Executor(device="cpu").run_sync(g, {"a": a, "b": b})["y"]
    np.testing.assert_allclose(y, a + b, rtol=1e-6)


def _save(m, _n=[0]):
    import tempfile
    _n[0] += 1
    path = f"{tempfile.mkdtemp()}/m{_n[0]}.onnx"
    onnx.save(m, path)
    return path


def test_skipped_middle_output_gets_a_value(registered):
    def stats(x):
        return x - x.mean(), x.mean().astype(x.dtype), x.std().astype(x.dtype)
    registered("stats", domain=DOMAIN, inputs=["x"], outputs=["y", "mean?", "std?"],
               shape=lambda ins, a: [(ins[0].shape, ins[0].dtype), ((), ins[0].dtype), ((), ins[0].dtype)],
               reference=stats)
    node = helper.make_node("Stats", ["x"], ["y", "", "s"], domain=DOMAIN)
    m = _model([node], [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4]),
                helper.make_tensor_value_info("s", TensorProto.FLOAT, [])])
    g = npurun.load(_save(m))
    x = _x((4,))
    out = npurun.Executor(device="reference").run_sync(g, {"x": x})
    np.testing.assert_allclose(out["s"], x.std(), rtol=1e-6)


def test_opset_range(registered, tmp_path):
    _register_tanh(registered, since=2, until=3)
    node = helper.make_node("ScaledTanh", ["x"], ["y"], domain=DOMAIN)
    vi = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])], \
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])]
    for version, ok in ((1, False), (2, True), (3, True), (4, False)):
        path = _save(_model([node], *vi, opsets=((DOMAIN, version),)))
        if ok:
            assert npurun.load(path).nodes[0].op == "test.ops.scaled_tanh"
        else:
            with pytest.raises(ModelError, match=f"ScaledTanh \\(domain {DOMAIN}, opset {version}\\)"):
                npurun.load(path)
    with pytest.raises(ModelError, match="past the opsets 2..3 registered for test.ops.scaled_tanh"):
        npurun.load(_save(_model([node], *vi, opsets=((DOMAIN, 4),))))
    # a second op may take the later opsets of the same ONNX op; an overlap is refused
    registered("scaled_tanh_v4", domain=DOMAIN, onnx_op="ScaledTanh", since=4,
               attrs={"alpha": 1.0, "beta": 1.0}, reference=_scaled_tanh)
    assert npurun.load(_save(_model([node], *vi, opsets=((DOMAIN, 4),)))).nodes[0].op == "test.ops.scaled_tanh_v4"
    with pytest.raises(RegistrationError, match="opsets 3.. overlap those of test.ops.scaled_tanh \\(2..3\\)"):
        registered("scaled_tanh_v3", domain=DOMAIN, onnx_op="ScaledTanh", since=3,
                   attrs={"alpha": 1.0, "beta": 1.0}, reference=_scaled_tanh)


def test_unknown_attribute_and_missing_required(registered, tmp_path):
    _register_tanh(registered, attrs={"alpha": npurun.REQUIRED, "beta": 1.0})
    with pytest.raises(ModelError, match="missing required attribute\\(s\\) alpha"):
        npurun.load(_tanh_model(tmp_path, beta=2.0))
    with pytest.raises(ModelError, match="attribute\\(s\\) gamma not declared by test.ops.scaled_tanh"):
        npurun.load(_tanh_model(tmp_path, alpha=1.0, gamma=2.0))


def test_shape_rule_and_dtype_errors_name_the_node(registered, tmp_path):
    def rule(ins, a):
        if ins[0].shape[-1] != 4:
            raise ValueError(f"last axis must be 4, got {ins[0].shape[-1]}")
        return [(ins[0].shape, ins[0].dtype)]
    _register_tanh(registered, shape=rule)
    with pytest.raises(ModelError, match="node 'st' \\(test.ops.scaled_tanh\\): last axis must be 4, got 5"):
        npurun.load(_tanh_model(tmp_path))
    _register_tanh(registered, dtypes={"x": ("f16",)}, replace=True)
    with pytest.raises(ModelError, match="operand x \\('x'\\) has dtype f32; test.ops.scaled_tanh expects f16"):
        npurun.load(_tanh_model(tmp_path))
    _register_tanh(registered, shape=lambda ins, a: [(ins[0].shape, "float32")], replace=True)
    with pytest.raises(ModelError, match="gave an invalid type \\[.*\\] 'float32'"):
        npurun.load(_tanh_model(tmp_path))
    _register_tanh(registered, shape=lambda ins, a: ins[7], replace=True)
    with pytest.raises(ModelError, match="the shape rule of test.ops.scaled_tanh raised IndexError"):
        npurun.load(_tanh_model(tmp_path))


def test_kernel_failure_at_run_is_an_npurun_error(registered, tmp_path):
    def broken(x, *, alpha, beta):
        raise FloatingPointError("boom")
    _register_tanh(registered, reference=broken)
    sess = npurun.InferenceSession(_tanh_model(tmp_path), device="reference")
    with pytest.raises(npurun.NpurunError, match="node 'st' \\(test.ops.scaled_tanh\\) failed .*boom"):
        sess.run(None, {"x": _x()})


@pytest.mark.parametrize("kw, message", [
    (dict(name="ScaledTanh"), "name 'ScaledTanh' must be lowercase snake case"),
    (dict(name="tanh_f16"), "ends in a precision suffix"),
    (dict(domain="my..ops"), "domain 'my..ops' must be dotted identifiers"),
    (dict(onnx_op="Scaled-Tanh"), "onnx_op 'Scaled-Tanh' must be an ONNX op_type"),
    (dict(since=3, until=2), "opset range since=3 until=2"),
    (dict(inputs=["x*", "y"]), "only the last input may be variadic"),
    (dict(inputs="x"), "inputs must be a list of operand names"),
    (dict(inputs=["x", "x?"]), "inputs repeat a name"),
    (dict(outputs=["y?", "z"]), "optional results \\('\\?'\\) must come last"),
    (dict(outputs=[]), "an op produces at least one result"),
    (dict(attrs={"pipeline": 2}), "attribute name 'pipeline' is reserved"),
    (dict(groups="elementwise"), "groups must be a set of lowercase names"),
    (dict(dtypes={"z": ("f32",)}), "dtypes names operand 'z'"),
    (dict(dtypes={"x": ("float",)}), "unknown dtype\\(s\\) \\['float'\\]"),
    (dict(shape="elementwise"), "shape must be 'same', 'broadcast' or a rule"),
    (dict(macs=-1), "macs must be a number per result element"),
    (dict(bytes=12), "bytes must be bytes\\(attrs, ins, outs\\)"),
    (dict(unit="gpu"), "unit 'gpu': expected one of vector, matrix"),
    (dict(vector_ops=0), "vector_ops must be a positive number"),
    (dict(reference=None), "reference must be the op's NumPy kernel"),
    (dict(reference=lambda x: x), "reference kernel '<lambda>' cannot be called as fn\\(x, \\*, alpha, beta\\)"),
    (dict(cpu=lambda x, y, *, alpha, beta: x), "cpu kernel '<lambda>' cannot be called"),
    (dict(cpu=_scaled_tanh, cpu_factory=lambda p: _scaled_tanh), "give cpu or cpu_factory, not both"),
])
def test_bad_specs_are_refused(registered, kw, message):
    spec = dict(name="scaled_tanh", domain=DOMAIN, attrs={"alpha": 1.0, "beta": 1.0}, reference=_scaled_tanh)
    spec.update(kw)
    name = spec.pop("name")
    with pytest.raises(RegistrationError, match=message):
        registered(name, **spec)
    assert not any(k.startswith(DOMAIN) for k in OPS)  # nothing half-registered


def test_collisions_and_unregister(registered):
    with pytest.raises(RegistrationError, match="matmul is one of npurun's own ops"):
        registered("matmul", reference=np.matmul, inputs=["a", "b"])
    with pytest.raises(RegistrationError, match="ONNX op Relu of domain ai.onnx already has one of npurun's own"):
        registered("my_relu", onnx_op="Relu", reference=lambda x: x)
    _register_tanh(registered, cpu=_scaled_tanh_cpu)
    with pytest.raises(RegistrationError, match="test.ops.scaled_tanh is already registered; pass replace=True"):
        _register_tanh(registered)
    from npurun.backends.cpu import CPU_KERNELS
    from npurun.backends.reference.kernels import KERNELS
    from npurun.frontend.onnx.converters import find
    unregister_op("test.ops.scaled_tanh")
    assert "test.ops.scaled_tanh" not in OPS and "test.ops.scaled_tanh" not in KERNELS
    assert "test.ops.scaled_tanh" not in CPU_KERNELS and find("ScaledTanh", 1, DOMAIN) is None
    with pytest.raises(RegistrationError, match="not an op registered through npurun.register_op"):
        unregister_op("test.ops.scaled_tanh")
    with pytest.raises(RegistrationError, match="not an op registered"):
        unregister_op("matmul")


def test_unregistered_custom_domain_says_how(tmp_path):
    with pytest.raises(ModelError, match="ScaledTanh \\(domain test.ops, opset 1\\) x1: no converter "
                                         "\\(npurun.register_op adds ops of any domain"):
        npurun.load(_tanh_model(tmp_path))


def test_cli_ops_modules(tmp_path, capsys):
    from npurun.cli import main
    mod = tmp_path / "cli_ops.py"
    mod.write_text("import numpy as np, npurun\n"
                   "npurun.register_op('scaled_tanh', domain='test.ops', attrs={'alpha': 1.0, 'beta': 1.0},\n"
                   "                   reference=lambda x, *, alpha, beta: alpha * np.tanh(beta * x))\n")
    path = _tanh_model(tmp_path)
    try:
        assert main(["--ops", str(mod), "ir", "print", str(path)]) == 0
        assert "op test.ops.scaled_tanh @st" in capsys.readouterr().out
        assert main(["--ops", str(mod), "ir", "verify", str(path)]) == 0  # a second load is a no-op
    finally:
        if "test.ops.scaled_tanh" in registered_ops():
            unregister_op("test.ops.scaled_tanh")
    assert main(["--ops", str(tmp_path / "nope.py"), "info"]) == 1
    assert "op module" in capsys.readouterr().err
    bad = tmp_path / "bad_ops.py"
    bad.write_text("raise ImportError('needs libfoo')\n")
    assert main(["--ops", str(bad), "info"]) == 1
    assert "cannot import it (ImportError: needs libfoo)" in capsys.readouterr().err


def test_kernel_failure_while_folding_at_import_is_a_model_error(registered, tmp_path):
    from onnx import numpy_helper

    def broken(x, *, alpha, beta):
        raise FloatingPointError("boom")
    _register_tanh(registered, reference=broken)
    node = helper.make_node("ScaledTanh", ["c"], ["y"], domain=DOMAIN)  # a constant operand: folded at import
    m = _model([node], [], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])],
               inits=[numpy_helper.from_array(_x((3,)), "c")])
    with pytest.raises(ModelError, match="ScaledTanh .*converting it failed \\(FloatingPointError: boom\\)"):
        npurun.load(_save(m))


def test_any_rank_lets_a_rule_see_unknown_ranks():
    """An operand of unknown rank (an If's output) is refused unless the op says its rule
    takes it (`any_rank=True`), as com.microsoft FusedConv does after ORT inlines an If."""
    from npurun.ir import parse, verify
    from npurun.errors import VerifyError
    text = """npuir 1
graph g
input x: [*] f32 DRAM0
op test.rank.OP (x: [*] f32 DRAM0 -> y: [*] f32 DRAM0)
output y: [*] f32 DRAM0
"""
    rule = lambda ins, a: [(None if ins[0].shape is None else ins[0].shape, ins[0].dtype)]  # noqa: E731
    for name, any_rank in (("strict", False), ("lenient", True)):
        npurun.register_op(name, domain="test.rank", reference=lambda x: x, shape=rule, any_rank=any_rank)
    try:
        with pytest.raises(VerifyError, match="unknown rank"):
            verify(parse(text.replace("OP", "strict")))
        verify(parse(text.replace("OP", "lenient")))
    finally:
        unregister_op("test.rank.strict")
        unregister_op("test.rank.lenient")
