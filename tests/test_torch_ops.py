"""npu::matmul, npu::conv2d and npu::run: PyTorch custom ops executing through an npurun
Executor; opcheck and torch.compile(fullgraph=True)."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

import npurun  # noqa: E402
import npurun.torch_ops as npu_ops  # noqa: E402


@pytest.fixture(autouse=True)
def reference_device(monkeypatch):
    # The ops run through an Executor; the reference backend is the oracle-grade one to run
    # them on in tests (NPURUN_TORCH_OPS_DEVICE picks another).
    monkeypatch.setattr(npu_ops, "DEVICE", "reference")


@pytest.fixture
def t(rng):
    return lambda *shape: torch.from_numpy(rng.standard_normal(shape).astype(np.float32))


@pytest.fixture(scope="module")
def espcn_key():
    from npurun import zoo
    return npu_ops.register_model(zoo.path("espcn_x3.onnx"))


def test_ops_match_torch(t):
    a, b = t(5, 7), t(7, 3)
    torch.testing.assert_close(torch.ops.npu.matmul(a, b), a @ b, rtol=1e-5, atol=1e-5)
    x, w, bias = t(1, 4, 9, 11), t(6, 4, 3, 3), t(6)
    got = torch.ops.npu.conv2d(x, w, bias, [2, 1], [1, 0], [1, 2], 1)
    torch.testing.assert_close(got, torch.nn.functional.conv2d(x, w, bias, [2, 1], [1, 0], [1, 2]),
                               rtol=1e-4, atol=1e-4)


def test_opcheck(t, espcn_key):
    cases = [
        (torch.ops.npu.matmul.default, (t(5, 7), t(7, 3))),
        (torch.ops.npu.matmul.default, (t(2, 5, 7).requires_grad_(), t(7, 3).requires_grad_())),
        (torch.ops.npu.conv2d.default, (t(1, 4, 9, 9), t(6, 4, 3, 3), t(6), [1, 1], [1, 1], [1, 1], 1)),
        (torch.ops.npu.conv2d.default, (t(1, 4, 9, 9).requires_grad_(), t(4, 2, 3, 3).requires_grad_(), None,
                                        [2, 2], [0, 1], [1, 1], 2)),
        (torch.ops.npu.run.default, (espcn_key, [t(1, 1, 6, 10)])),
    ]
    for op, args in cases:
        result = torch.library.opcheck(op, args)
        assert all(v == "SUCCESS" for v in result.values()), (op, result)


def test_torch_compile_fullgraph(t, espcn_key):
    from npurun import zoo
    g = npurun.load(zoo.path("espcn_x3.onnx"))

    def f(x, w, b, a2, b2):
        y = torch.ops.npu.conv2d(torch.relu(x), w, b, [1, 1], [1, 1], [1, 1], 1)
        up = torch.ops.npu.run(espcn_key, [x[:, :1].contiguous()])[0]
        return y * 2, torch.ops.npu.matmul(a2, b2) + 1, up

    args = (t(1, 4, 9, 9), t(6, 4, 3, 3), t(6), t(5, 7), t(7, 3))
    # aot_eager traces through dynamo and AOTAutograd with the fake kernels (inductor adds
    # only code generation around the opaque calls, and minutes of compile time on 2 cores).
    got = torch.compile(f, fullgraph=True, backend="aot_eager")(*args)
    x, w, b, a2, b2 = args
    torch.testing.assert_close(got[0], torch.nn.functional.conv2d(torch.relu(x), w, b, 1, 1) * 2, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(got[1], a2 @ b2 + 1, rtol=1e-5, atol=1e-5)
    want = npurun.Executor("reference").run_sync(g, x[:, :1].numpy().copy())["output"]
    np.testing.assert_allclose(got[2].numpy(), want, rtol=1e-4, atol=1e-5)


def test_unregistered_model_is_a_clear_error(t):
    with pytest.raises(npurun.NpurunError, match="no model registered as 'nope'"):
        torch.ops.npu.run("nope", [t(1, 1, 4, 4)])
