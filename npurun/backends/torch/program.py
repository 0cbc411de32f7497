"""The program the torch backend compiles to: a graph's nodes as PyTorch calls on one device.

Values stay torch tensors on the device between nodes. Three kinds of step:

* a **torch** step runs a lowering of `kernels.py` on the device;
* a **host** step is a torch step whose inputs are all shapes (what `shape`/`size` return,
  and arithmetic on them): it runs on the CPU, so reshapes never read device memory back;
* a **fallback** step runs the reference kernel: its operands go to NumPy and its results
  come back (the reason is the rule `npurun ops-report --device torch:...` shows).

On CUDA a whole run is captured once per input shape in a CUDA graph and replayed from
static input and output buffers (`capture`, `CapturedRun`); `run` copies the caller's
arrays in and the outputs out, nothing else.
"""
from __future__ import annotations

import warnings

import ml_dtypes
import numpy as np
import torch

from ...errors import BackendError, InputError, NpurunError
from ...ir.graph import Node
from ...ir.shapes import bind, format_shape
from ..base import Program, _describe, check_inputs
from ..reference.kernels import KERNELS as REFERENCE
from . import kernels as K

HOST_ONLY = {"shape", "size"}  # read a tensor's shape, never its data
NEVER_HOST = {"constant_of_shape", "expand", "tile", "range"}  # make big tensors from shapes

ABSENT, CONST, DEVICE, HOST, NUMPY, AS_IS = range(6)  # how a step gets each operand


def to_torch(a, device):
    """A NumPy array as a tensor on `device`; types torch has no tensors for stay NumPy."""
    if isinstance(a, np.generic):
        a = np.asarray(a)
    if not isinstance(a, np.ndarray):
        return a  # a sequence, None
    if a.dtype == ml_dtypes.bfloat16:
        return torch.from_numpy(_contiguous(a).view(np.int16)).view(torch.bfloat16).to(device)
    if a.dtype.isbuiltin != 1 or a.dtype.kind in "OUS" or a.dtype in (np.uint16, np.uint32, np.uint64):
        return a
    a = _contiguous(a)
    if not a.flags.writeable:  # torch warns; kernels never write into operands
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            return torch.from_numpy(a).to(device)
    return torch.from_numpy(a).to(device)


def _contiguous(a):
    return a if a.flags.c_contiguous else np.ascontiguousarray(a)  # (which makes a 0-d array 1-d)


def to_numpy(t):
    if isinstance(t, torch.Tensor):
        t = t.detach()
        if t.dtype == torch.bfloat16:
            return t.contiguous().view(torch.int16).cpu().numpy().view(ml_dtypes.bfloat16)
        return t.contiguous().cpu().numpy()
    if isinstance(t, (list, tuple)):
        return [to_numpy(x) for x in t]
    return t


class _NumpyView:
    """An environment seen as NumPy arrays: what a reference region program reads."""

    def __init__(self, env):
        self.env = env

    def __contains__(self, k):
        return k in self.env

    def __getitem__(self, k):
        return to_numpy(self.env[k])


class TorchProgram(Program):
    def __init__(self, graph, backend):
        # The base class orders the steps, finds each value's last reader and compiles
        # control-flow regions (which run on the reference kernels).
        super().__init__(graph, REFERENCE, backend.name)
        self.device = backend.device
        self.threads = backend.parallelism
        self.use_cuda_graphs = self.device.type == "cuda"
        self._captured: dict = {}
        self._const_cache: dict = {}
        self.fallbacks: list[tuple[Node, str]] = []
        host_values: set[str] = set()
        self.plan = []
        for n, ref_fn, attrs, dead in self.steps:
            ok, why = backend.supports(n, graph)
            reads = [i for i in n.inputs if i and not graph.values[i].is_const]
            reads += [c for r in n.regions.values() for c in r.captures()]
            on_host = n.op in HOST_ONLY or (n.op not in NEVER_HOST and bool(reads)
                                            and all(i in host_values for i in reads))
            if on_host:
                host_values.update(n.outputs)
            dev = torch.device("cpu") if on_host else self.device
            if ok:
                self.plan.append(self._torch_step(n, attrs, dead, dev))
            else:
                self.fallbacks.append((n, why))
                specs = [(ABSENT, None) if not i else (CONST, graph.values[i].data)
                         if graph.values[i].is_const else (NUMPY, i) for i in n.inputs]
                self.plan.append((n, ref_fn, attrs, dead, False, dev, specs, None))
        self.host_values = host_values
        self.cuda_graph_status = self._capturable()

    # --- compile
    def _const(self, name, dev, dtype=None):
        key = (name, str(dev), dtype)
        t = self._const_cache.get(key)
        if t is None:
            t = to_torch(self.graph.values[name].data, dev)
            if dtype is not None and isinstance(t, torch.Tensor) and t.dtype.is_floating_point:
                t = t.to(dtype)
            self._const_cache[key] = t
        return t

    def _torch_step(self, n, attrs, dead, dev):
        host_pos = K.HOST_OPERANDS.get(n.op, ())
        pdtype = {"f16": torch.float16, "bf16": torch.bfloat16}.get(n.precision)
        specs = []
        for pos, i in enumerate(n.inputs):
            v = self.graph.values.get(i) if i else None
            if v is None:
                specs.append((ABSENT, None))
            elif pos in host_pos:
                specs.append((CONST, v.data) if v.is_const else (HOST, i))
            elif v.is_const:
                specs.append((CONST, self._const(i, dev, pdtype)))
            else:
                specs.append((AS_IS if n.op in HOST_ONLY else DEVICE, i))
        fn = K.KERNELS[n.op]
        attrs = dict(attrs)
        if n.op in K.NEEDS_DEVICE:
            attrs["_device"] = dev
        if n.op == "layer_normalization" and len(n.outputs) == 1:
            fn = K.layer_normalization_fast
        if pdtype is not None:
            fn = _in_precision(fn, pdtype)
        elif n.precision == "i8":
            fn, specs = self._int8(n, specs, dev)
        outs = [K.TORCH_DTYPES.get(self.graph.values[o].dtype) if self.graph.values[o].kind == "tensor"
                else None for o in n.outputs]
        return (n, fn, attrs, dead, True, dev, specs, outs)

    def _int8(self, n, specs, dev):
        """Weights quantized once here (per output channel); activations at run time."""
        w = self._const(n.inputs[1], dev).to(torch.float32)
        if n.op == "matmul":  # w is (K, N)
            qw, sw = K.quantize_sym(w, dim=1)
            return K.matmul_i8(qw, sw), specs
        qw, sw = K.quantize_sym(w, dim=0)  # conv: w is (M, C, kh, kw)
        return K.conv_i8(qw.reshape(qw.shape[0], -1).t().contiguous(), sw, 1), specs

    def _capturable(self) -> str:
        """'yes', or why a CUDA graph cannot hold a run of this program."""
        if self.device.type != "cuda":
            return "no: CUDA graphs need a CUDA device (runs are eager)"
        for n, fn, attrs, dead, is_torch, dev, specs, outs in self.plan:
            if not is_torch and dev.type != "cpu":
                return f"{n.label()} runs on the reference kernels (host round trip)"
        for name in self.graph.inputs + self.graph.outputs:
            if self.graph.values[name].kind != "tensor" or self.graph.values[name].dtype not in K.TORCH_DTYPES:
                return f"graph input/output {name!r} is not a tensor type torch holds"
        return "yes"

    # --- run
    def _inputs(self, feeds: dict) -> dict:
        return {k: to_torch(a, self.device) for k, a in feeds.items()}

    def run(self, feeds, progress=None, attention=None):
        feeds = check_inputs(self.graph, feeds)
        if self.threads and torch.get_num_threads() != self.threads and self.device.type == "cpu":
            torch.set_num_threads(self.threads)
        with torch.no_grad():
            if self.use_cuda_graphs and self.cuda_graph_status == "yes" and progress is None:
                cap = self.capture_for(feeds)
                if cap is not None:
                    for k, a in feeds.items():
                        cap.inputs[k].copy_(torch.from_numpy(a) if a.dtype != ml_dtypes.bfloat16
                                            else to_torch(a, "cpu"))
                    cap.replay()
                    return {k: to_numpy(t) for k, t in cap.outputs.items()}
            env = self._env(self._inputs(feeds))
            self._execute(env, progress)
            return {nm: to_numpy(env[nm]) for nm in self.graph.outputs}

    def run_torch(self, feeds: dict) -> dict:
        """A run on tensors: inputs are moved to the program's device if they are elsewhere;
        outputs stay on the device (no host copies)."""
        check_tensor_inputs(self.graph, feeds)
        with torch.no_grad():
            env = self._env({k: t.to(self.device) for k, t in feeds.items()})
            self._execute(env, None)
            return {nm: env[nm] for nm in self.graph.outputs}

    def _env(self, inputs: dict) -> dict:
        env = {}
        env.update(inputs)
        for nm in self._const_outputs:  # an output the passes folded: a fresh tensor per run
            env[nm] = to_torch(np.array(self.consts[nm], copy=True), self.device)
        return env

    def _execute(self, env, progress=None, transfers=None, record=False):
        """Run every step. `transfers` maps (step, operand) -> a device copy of a host value,
        recorded in a warm-up run and reused while a CUDA graph is captured (a capture may not
        copy from host memory; host values depend on shapes only, so the copy is the same)."""
        total = len(self.plan)
        for k, (n, fn, attrs, dead, is_torch, dev, specs, outs) in enumerate(self.plan):
            args = []
            for pos, (mode, p) in enumerate(specs):
                if mode == ABSENT:
                    args.append(None)
                elif mode == CONST:
                    args.append(p)
                elif mode == DEVICE:
                    x = env[p]
                    if isinstance(x, torch.Tensor) and x.device != dev:
                        if transfers is not None and (k, pos) in transfers and not record:
                            x = transfers[(k, pos)]
                        else:
                            x = x.to(dev)
                            if record and transfers is not None:
                                transfers[(k, pos)] = x
                    args.append(x)
                elif mode == AS_IS:
                    args.append(env[p])
                else:  # HOST, NUMPY
                    args.append(to_numpy(env[p]))
            call_attrs = attrs
            if not is_torch:
                subs = self.subprograms.get(id(n))
                if subs:
                    view = _NumpyView(env)
                    call_attrs = {**attrs, "_regions": {r: (lambda ins, p=p: p.call(ins, view)) for r, p in subs.items()}}
            try:
                res = fn(*args, **call_attrs)
            except NpurunError:
                raise
            except Exception as e:  # a kernel failure names the node, never a bare traceback
                raise NpurunError(f"{self.graph.source}: {n.label()} failed on inputs ({_describe_any(args)}) "
                                  f"on {'torch' if is_torch else 'reference'}: {e.__class__.__name__}: {e}") from e
            res = res if isinstance(res, tuple) else (res,)
            if is_torch:
                for nm, r, want in zip(n.outputs, res, outs):
                    env[nm] = r.to(want) if want is not None and isinstance(r, torch.Tensor) and r.dtype != want else r
            else:
                for nm, r in zip(n.outputs, res):
                    env[nm] = to_torch(r, dev)
            for nm in dead:
                env.pop(nm, None)
            if progress:
                progress(k + 1, total, n.label())

    # --- CUDA graphs
    def capture_for(self, feeds: dict):
        """The captured run for these inputs' shapes and dtypes, made on first use; None where
        capture failed (the reason is in `cuda_graph_status`; runs are then eager)."""
        key = tuple((k, tuple(a.shape), str(a.dtype)) for k, a in feeds.items())
        if key not in self._captured:
            try:
                self._captured[key] = self.capture(feeds)
            except Exception as e:  # e.g. a kernel that reads device memory on the host
                self._captured[key] = None
                self.cuda_graph_status = f"capture failed: {e.__class__.__name__}: {str(e).splitlines()[0][:200]}"
        return self._captured[key]

    def capture(self, feeds: dict) -> "CapturedRun":
        return CapturedRun(self, feeds)


class CapturedRun:
    """One run of a program captured in a CUDA graph: write into `inputs`, call `replay()`,
    read `outputs` (device tensors, overwritten by the next replay)."""

    def __init__(self, program: TorchProgram, feeds: dict, warmup: int = 2):
        if program.device.type != "cuda":
            raise BackendError(f"CUDA graphs need a CUDA device; this program runs on {program.device}")
        if program.cuda_graph_status != "yes":
            raise BackendError(f"{program.graph.source}: cannot capture in a CUDA graph: {program.cuda_graph_status}")
        self.program = program
        dev = program.device
        self.inputs = {k: (a.to(dev).clone() if isinstance(a, torch.Tensor) else to_torch(a, dev).clone())
                       for k, a in feeds.items()}
        transfers: dict = {}
        with torch.no_grad():
            side = torch.cuda.Stream(dev)
            side.wait_stream(torch.cuda.current_stream(dev))
            with torch.cuda.stream(side):  # warm-up (lazy init, cuDNN plans) off the capture
                for i in range(warmup):
                    program._execute(dict(self.inputs), transfers=transfers, record=(i == 0))
            torch.cuda.current_stream(dev).wait_stream(side)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                env = dict(self.inputs)
                program._execute(env, transfers=transfers)
                self.outputs = {k: env[k] for k in program.graph.outputs}
        self._transfers = transfers  # kept alive: the graph reads them

    def replay(self):
        self.graph.replay()


def _in_precision(fn, dtype):
    """The kernel computed in `dtype` (f16/bf16): float operands cast in; the program casts
    results back to their declared types."""
    def run(*args, **attrs):
        args = [a.to(dtype) if isinstance(a, torch.Tensor) and a.dtype.is_floating_point and a.dtype != dtype
                else a for a in args]
        return fn(*args, **attrs)
    return run


def check_tensor_inputs(graph, feeds: dict) -> None:
    unknown = [k for k in feeds if k not in graph.inputs]
    missing = [k for k in graph.inputs if k not in feeds]
    if unknown or missing:
        raise InputError(f"{graph.source}: inputs {sorted(feeds)} do not match the model's {graph.inputs}")
    env: dict = {}
    for k in graph.inputs:
        v, t = graph.values[k], feeds[k]
        if not isinstance(t, torch.Tensor):
            raise InputError(f"{graph.source}: input {k!r} must be a torch tensor, got {type(t).__name__}")
        want = K.TORCH_DTYPES.get(v.dtype)
        if t.dtype != want:
            raise InputError(f"{graph.source}: input {k!r} has dtype {t.dtype}, expected {want} ({v.dtype})")
        if not bind(v.shape, tuple(t.shape), env):
            raise InputError(f"{graph.source}: input {k!r} has shape {list(t.shape)}, expected {format_shape(v.shape)}")


def _describe_any(args) -> str:
    return ", ".join(f"{str(a.dtype).replace('torch.', '')}{list(a.shape)}" if isinstance(a, torch.Tensor)
                     else _describe([a]) for a in args if a is not None)
