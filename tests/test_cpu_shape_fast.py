"""The cpu backend's small-tensor fast paths (cpu/ops/shape_fast.py: gather, slice, split,
reduce_mean; cpu/ops/unsqueeze.py) and the 1-D conv's small path with a fused activation
(cpu/ops/conv1d.py), against the reference kernels on fresh random non-zero inputs: same
values, dtypes, shapes, and a view exactly where the reference returns one."""
import numpy as np
import pytest

from npurun.backends.cpu.ops import FACTORIES, conv1d, shape_fast
from npurun.backends.reference.kernels import KERNELS as REF

from conftest import nonzero_normal


def _same(got, want):
    assert type(got) is type(want)
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("shape,axis,idx", [
    ((3,), 0, np.array([1])), ((3,), 0, np.array(2)), ((2, 1, 128), 0, np.array(0)),
    ((2, 1, 128), 0, np.array(1, np.int32)), ((4, 5, 6), 2, np.array([3])), ((4, 5, 6), -1, np.array([[5]])),
    ((4, 5), 1, np.array([-1])),  # negative: the reference kernel
    ((4, 5), 0, np.array([0, 3, -2])),  # several: the reference kernel
])
def test_gather_matches_reference(rng, shape, axis, idx):
    x = nonzero_normal(rng, shape)
    _same(shape_fast._gather(x, idx, axis=axis), REF["gather"](x, idx, axis=axis))
    xi = rng.integers(1, 100, shape).astype(np.int64)  # shapes are int64 vectors
    _same(shape_fast._gather(xi, idx, axis=axis), REF["gather"](xi, idx, axis=axis))


@pytest.mark.parametrize("axis,idx", [(0, np.array(3)), (0, np.array([0])), (1, np.array(1)), (-1, np.array([4])),
                                      (2, np.array(0, np.int32))])
def test_gather_from_a_strided_tensor_copies_only_what_it_reads(rng, axis, idx):
    """A transposed sequence (not C-contiguous): basic indexing, copied (as take copies)."""
    x = nonzero_normal(rng, (6, 2, 5)).transpose(2, 1, 0)[:, :, ::-1]
    got, want = shape_fast._gather(x, idx, axis=axis), REF["gather"](x, idx, axis=axis)
    _same(got, want)
    assert not np.shares_memory(got, x)


def test_gather_from_a_strided_tensor_out_of_range_still_raises(rng):
    with pytest.raises(IndexError):
        shape_fast._gather(nonzero_normal(rng, (4, 3)).T, np.array(3), axis=0)


@pytest.mark.parametrize("shape,axis,sizes,num_outputs", [
    ((3, 400), 1, np.array([100, 100, 100, 100]), 0), ((3, 400), -1, np.array([1, 0, 399]), 0), ((6, 5), 0, None, 3),
    ((5, 4), 0, None, 2), ((5, 4), 0, None, 4),  # uneven: the last part shorter, or a negative one (reference)
    ((2, 7, 3), 1, np.array([3, 4], np.int32), 0), ((4,), 0, np.array([1, 2]), 0),  # sizes not summing up: the reference
])
def test_split_matches_reference(rng, shape, axis, sizes, num_outputs):
    x = nonzero_normal(rng, shape)
    for src in (x, np.asfortranarray(x)):
        got = shape_fast._split(src, sizes, axis=axis, num_outputs=num_outputs)
        want = REF["split"](src, sizes, axis=axis, num_outputs=num_outputs)
        assert type(got) is tuple and len(got) == len(want)
        for g, w in zip(got, want):
            _same(g, w)
            assert np.shares_memory(g, src) == np.shares_memory(w, src)


def test_gather_index_out_of_range_still_raises(rng):
    with pytest.raises(IndexError):
        shape_fast._gather(nonzero_normal(rng, (3,)), np.array([3]), axis=0)


A = np.array
SLICES = [  # starts, ends, axes, steps
    (A([0]), A([129]), A([1]), A([1])), (A([129]), A([258]), A([1]), A([1])),
    (A([1]), A([-1]), None, None), (A([5]), A([2**62]), A([-1]), A([2])),
    (A([-2]), A([-2**62]), A([2]), A([-1])), (A([0, 1]), A([2, 3]), A([0, 2]), None),
]


@pytest.mark.parametrize("starts,ends,axes,steps", SLICES)
def test_slice_matches_reference(rng, starts, ends, axes, steps):
    x = nonzero_normal(rng, (3, 258, 7))
    got, want = shape_fast._slice(x, starts, ends, axes, steps), REF["slice"](x, starts, ends, axes, steps)
    _same(got, want)
    assert np.shares_memory(got, x) == np.shares_memory(want, x)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64])
@pytest.mark.parametrize("shape,axes,keepdims", [
    ((1, 1), A([1]), 0), ((3, 5, 7), A([1]), 1), ((3, 5, 7), A([-1, 0]), 0), ((3, 5, 7), A([0, 1, 2]), 0),
    ((4, 300), A([1]), 1), ((3, 5), None, 0), ((3, 5), A([1, 1]), 0),
])
def test_reduce_mean_matches_reference(rng, dtype, shape, axes, keepdims):
    x = (nonzero_normal(rng, shape, np.float64) * 10).astype(dtype)
    kw = {"keepdims": keepdims, "noop_with_empty_axes": 0}
    try:
        want = REF["reduce_mean"](x, axes, **kw)
    except Exception as e:  # noqa: BLE001 -- the fast path must raise as the reference does
        with pytest.raises(type(e)):
            shape_fast._reduce_mean(x, axes, **kw)
        return
    _same(shape_fast._reduce_mean(x, axes, **kw), want)


@pytest.mark.parametrize("shape,axes", [((1, 128), A([1])), ((5,), A([0])), ((2, 3), A([-1, 0])),
                                        ((2, 3), A([3]))])
def test_unsqueeze_matches_reference(rng, shape, axes):
    _cached_kernel_matches_reference("unsqueeze", nonzero_normal(rng, shape), axes)


def _cached_kernel_matches_reference(op, x, axes):
    """The fast kernel gives the reference's result (or raises its error) twice: the second
    call may come from the per-shape cache."""
    fast = FACTORIES[op](None)
    for _ in range(2):
        try:
            want = REF[op](x, axes)
        except Exception as e:  # noqa: BLE001
            with pytest.raises(type(e)):
                fast(x, axes)
            break
        _same(fast(x, axes), want)


@pytest.mark.parametrize("shape,axes", [((1, 128, 1), A([2])), ((1, 1, 1), A([1])), ((3, 1), A([-1])),
                                        ((3, 1), None), ((3, 2), A([1]))])
def test_squeeze_matches_reference(rng, shape, axes):
    _cached_kernel_matches_reference("squeeze", nonzero_normal(rng, shape), axes)


@pytest.mark.parametrize("act", [None, "relu", "sigmoid"])
@pytest.mark.parametrize("c,length,m,k,pad,stride", [(129, 3, 128, 3, 1, 1), (128, 3, 64, 3, 1, 2),
                                                     (128, 1, 1, 1, 0, 1), (1, 576, 20, 256, 0, 128)])
def test_conv1d_small_path_with_fused_activation(rng, act, c, length, m, k, pad, stride):
    x, w = nonzero_normal(rng, (1, c, length)), nonzero_normal(rng, (m, c, k)) * 0.1
    b = nonzero_normal(rng, (m,))
    win = {"kernel_shape": [k], "strides": [stride], "pads": [pad, pad], "dilations": [1], "group": 1,
           "auto_pad": "NOTSET"}

    class Prog:  # the 2-D fallback is not taken at these sizes
        def _conv(self, *a, **kw):
            raise AssertionError("small 1-D conv left the im2col path")
    got = conv1d.make(Prog())(x, w, b, activation=act or "", activation_params=[], **win)
    want = REF["conv"](x, w, b, **win)
    want = want if act is None else REF[act](want)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge"])
@pytest.mark.parametrize("shape,pads,axes", [((1, 512), [0, 0, 0, 64], None), ((3, 4, 5), [1, 0, 2, 2, 1, 3], None),
                                             ((3, 6), [2, 1], [-1])])
def test_pad_plan_cache_matches_reference(rng, mode, shape, pads, axes):
    from npurun.backends.cpu.ops import pad
    for dt in (np.int64, np.int32):  # same values, other bytes: a different cache key
        for _ in range(2):  # the second call runs the cached plan; the fill value is per call
            x = nonzero_normal(rng, shape)
            value = np.array(rng.uniform(1, 2), np.float32) if mode == "constant" else None
            ax = None if axes is None else np.array(axes, dt)
            want = REF["pad"](x, np.array(pads, dt), value, ax, mode=mode)
            _same(pad._pad(x, np.array(pads, dt), value, ax, mode=mode), want)

