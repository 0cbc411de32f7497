"""Calibration: run sample inputs through the float model and record every float value's range.

Sources (`feeds_from(spec, graph)`):
  * `random:N` — N random inputs (floats uniform in [0, 1), like a normalised image; integer
    inputs: ones for names containing "mask", zeros for "type", else small ids in [0, 100));
    symbolic dims are 1 for the leading (batch) dim and 64 elsewhere. A poor proxy for real data:
    prefer a folder;
  * a folder of `.npy` (single-input models) / `.npz` (keyed by input name) files, and of images
    (.png/.jpg/...) for models whose recipe npurun knows (ESPCN-style super-resolution: luma in
    [0, 1], as `npurun upscale` feeds it);
  * a list of feed dicts (Python API).

Per value (`Value.calib`): `min`/`max` over all samples; `pmin`/`pmax`, the 0.01th and 99.99th
percentiles; `mse_min`/`mse_max`, the clipping range (the min/max range scaled by a factor in
0.30..1.00) whose 8-bit quantization of the samples has the smallest mean squared error;
`method`, which of the three the quantization uses (`minmax` unless asked otherwise).
Percentiles and MSE use a fixed-seed subsample of at most 65536 elements per value per input.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..backends.reference.kernels import KERNELS
from ..backends.base import Program, check_inputs
from ..errors import InputError, NpurunError
from ..ir.dtypes import to_numpy
from ..ir.graph import Graph
from . import PrecisionError

METHODS = ("minmax", "percentile", "mse")
PERCENTILE = 99.99
SUBSAMPLE = 1 << 16
IMAGE_EXT = {".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff", ".webp"}
_FLOAT = ("f32", "f16", "bf16", "f64")


def feeds_from(spec, graph: Graph) -> list[dict]:
    """The calibration inputs a spec names: `random:N`, a folder, or a list of feed dicts."""
    if isinstance(spec, (list, tuple)):
        return [dict(f) for f in spec]
    s = str(spec)
    if s.startswith("random:"):
        try:
            n = int(s.split(":", 1)[1])
        except ValueError:
            n = 0
        if n < 1:
            raise PrecisionError(f"calibration {s!r}: expected random:N with N a positive integer")
        return random_feeds(graph, n)
    return folder_feeds(Path(s), graph)


def _concrete(shape) -> tuple:
    return tuple(d if isinstance(d, int) else (1 if i == 0 else 64) for i, d in enumerate(shape))


def random_feeds(graph: Graph, n: int, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        feeds = {}
        for name in graph.inputs:
            v = graph.values[name]
            shape, dt = _concrete(v.shape), to_numpy(v.dtype)
            if v.dtype in _FLOAT:
                feeds[name] = rng.random(shape, dtype=np.float32).astype(dt)
            elif dt.kind in "iu":
                low = name.lower()
                fill = 1 if "mask" in low else 0 if "type" in low else None
                feeds[name] = (np.full(shape, fill, dt) if fill is not None
                               else rng.integers(0, 100, shape).astype(dt))
            else:
                raise PrecisionError(f"{graph.source}: input {name!r} is {v.dtype}: random calibration "
                                     f"makes float and integer inputs only; give a folder of .npz files")
        out.append(feeds)
    return out


def folder_feeds(folder: Path, graph: Graph) -> list[dict]:
    if not folder.is_dir():
        raise PrecisionError(f"calibration {str(folder)!r}: not a folder and not random:N")
    files = sorted(p for p in folder.iterdir() if p.suffix.lower() in {".npy", ".npz"} | IMAGE_EXT)
    if not files:
        raise PrecisionError(f"{folder}: no .npy, .npz or image files to calibrate with")
    feeds = [_one_file(p, graph) for p in files]
    for p, f in zip(files, feeds):  # every sample must fit the model before any runs
        try:
            check_inputs(graph, f)
        except InputError as e:
            raise PrecisionError(f"calibration file {p}: {str(e).split(': ', 1)[-1]}") from None
    return feeds


def _one_file(p: Path, graph: Graph) -> dict:
    try:
        if p.suffix.lower() == ".npz":
            with np.load(p, allow_pickle=False) as z:
                return {k: z[k] for k in z.files}
        if p.suffix.lower() == ".npy":
            if len(graph.inputs) != 1:
                raise PrecisionError(f"calibration file {p}: a .npy file feeds a single-input model; "
                                     f"this one has inputs {', '.join(graph.inputs)}: use .npz keyed by name")
            return {graph.inputs[0]: np.load(p, allow_pickle=False)}
    except (ValueError, OSError, EOFError) as e:
        raise PrecisionError(f"calibration file {p}: not a readable NumPy file ({e})") from None
    return {graph.inputs[0]: _image_input(p, graph)}


def _image_input(p: Path, graph: Graph) -> np.ndarray:
    """An image through the model's recipe; only ESPCN-style super-resolution has one here."""
    from ..zoo import espcn
    try:
        espcn.model_scale(graph)
    except NpurunError:
        raise PrecisionError(f"calibration file {p}: npurun knows no image recipe for {graph.source} "
                             f"(only ESPCN-style super-resolution); give .npy/.npz inputs") from None
    return espcn.luma_to_array(espcn.read_image(p).convert("YCbCr").getchannel("Y"))


class _Stats:
    def __init__(self):
        self.lo, self.hi, self.samples = np.inf, -np.inf, []

    def add(self, a: np.ndarray, rng) -> None:
        a = np.asarray(a, dtype=np.float64).reshape(-1)
        if a.size == 0:
            return
        if not np.isfinite(a).all():
            raise PrecisionError("non-finite")
        self.lo, self.hi = min(self.lo, float(a.min())), max(self.hi, float(a.max()))
        self.samples.append(a if a.size <= SUBSAMPLE else rng.choice(a, SUBSAMPLE, replace=False))

    def result(self, method: str) -> dict:
        s = np.concatenate(self.samples)
        pmin = float(np.percentile(s, 100 - PERCENTILE))
        pmax = float(np.percentile(s, PERCENTILE))
        mlo, mhi = _mse_range(s, self.lo, self.hi)
        return {"min": self.lo, "max": self.hi, "pmin": pmin, "pmax": pmax,
                "mse_min": mlo, "mse_max": mhi, "method": method}


def _mse_range(s: np.ndarray, lo: float, hi: float) -> tuple[float, float]:
    """The clipping range alpha * [lo, hi] (alpha in 0.30..1.00) with the least 8-bit MSE."""
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    if hi <= lo:
        return lo, hi
    best = (np.inf, lo, hi)
    for alpha in np.linspace(1.0, 0.3, 15):
        a, b = lo * alpha, hi * alpha
        scale = (b - a) / 255
        zp = np.clip(np.rint(-a / scale), 0, 255)
        deq = (np.clip(np.rint(s / scale) + zp, 0, 255) - zp) * scale
        err = float(np.mean((deq - s) ** 2))
        if err < best[0]:
            best = (err, float(a), float(b))
    return best[1], best[2]


def calibrate(graph: Graph, feeds: list[dict], method: str = "minmax", shapes: dict | None = None) -> Graph:
    """Run `feeds` through `graph` (reference kernels, float) and set `calib` on every float
    tensor value it computes or reads. Returns the same graph. `shapes`, if given, receives
    the shape of every tensor of the first run (the analyzer's cost of each node)."""
    if method not in METHODS:
        raise PrecisionError(f"calibration method {method!r}: expected one of {', '.join(METHODS)}")
    if not feeds:
        raise PrecisionError(f"{graph.source}: calibration needs at least one input")
    stats: dict[str, _Stats] = {}
    rng = np.random.default_rng(0)

    def record(name, arr):
        if shapes is not None and isinstance(arr, np.ndarray) and name not in shapes:
            shapes[name] = arr.shape
        v = graph.values.get(name)
        if v is None or v.kind != "tensor" or v.dtype not in _FLOAT or not isinstance(arr, np.ndarray):
            return
        try:
            stats.setdefault(name, _Stats()).add(arr, rng)
        except PrecisionError:
            raise PrecisionError(f"{graph.source}: value {name!r} holds inf or NaN on a calibration "
                                 f"input: no precision can represent it; check the inputs") from None

    def observing(n, fn):
        def run(*args, **kw):
            res = fn(*args, **kw)
            for nm, a in zip(n.outputs, res if isinstance(res, tuple) else (res,)):
                record(nm, a)
            return res
        return run

    prog = Program(_float_copy(graph), KERNELS, "reference")
    prog.steps = [(n, observing(n, fn), attrs, dead) for n, fn, attrs, dead in prog.steps]
    for i, f in enumerate(feeds):
        try:
            checked = check_inputs(graph, f)
        except InputError as e:
            raise PrecisionError(f"calibration input {i}: {str(e).split(': ', 1)[-1]}") from None
        for nm, a in checked.items():
            record(nm, a)
        prog.run(checked)
    for name, st in stats.items():
        graph.values[name].calib = st.result(method)
    return graph


def _float_copy(graph: Graph) -> Graph:
    """The graph with every node at full precision (calibration observes float numbers)."""
    import copy
    g = copy.copy(graph)
    g.nodes = [copy.copy(n) for n in graph.nodes]
    for n in g.nodes:
        n.precision = None
    return g
