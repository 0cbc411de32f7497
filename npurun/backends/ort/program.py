"""The ort backend's program: runs of exportable nodes as ONNX Runtime sessions, the rest on
the reference kernels in between, in the graph's order."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort

from ...errors import BackendError, NpurunError
from ..base import Program, _describe, check_inputs
from ..reference.kernels import KERNELS as REFERENCE
from .export import export


class Segment:
    """Consecutive nodes exported as one ONNX model and run by one session."""

    def __init__(self, program, nodes, index):
        g = program.graph
        produced = {o for n in nodes for o in n.outputs}
        reads = []
        for n in nodes:
            reads += [i for i in n.inputs if i] + [c for r in n.regions.values() for c in r.captures()]
        self.inputs = list(dict.fromkeys(i for i in reads if i not in produced and not g.values[i].is_const))
        self.nodes = nodes
        self.outputs = []  # filled by the program: what later steps or the graph read
        self.index = index
        self.session = None

    def build(self, program, backend):
        g = program.graph
        if not self.outputs:  # nothing it computes is read: nothing to run
            return
        self.model = export(g, self.nodes, self.inputs, self.outputs, f"{g.name}_part{self.index}")
        so = ort.SessionOptions()
        so.intra_op_num_threads = backend.parallelism
        so.log_severity_level = 4  # errors come back as exceptions, with the nodes named
        providers = [(backend.provider, backend.provider_options)]
        if backend.provider != "CPUExecutionProvider":
            providers.append(("CPUExecutionProvider", {}))  # what the provider does not take
        try:
            self.session = ort.InferenceSession(self.model.SerializeToString(), so, providers=providers)
        except Exception as e:
            names = ", ".join(n.label() for n in self.nodes[:3]) + (" ..." if len(self.nodes) > 3 else "")
            raise BackendError(f"{g.source}: ONNX Runtime ({backend.provider}) refused the exported "
                               f"nodes [{names}]: {str(e).splitlines()[0][:300]}") from e


class OrtProgram(Program):
    def __init__(self, graph, backend):
        super().__init__(graph, REFERENCE, backend.name)
        self.provider = backend.provider
        self.items: list = []  # Segment, or a reference step (node, fn, attrs, dead)
        self.fallbacks = []
        run: list = []
        for step in self.steps:
            n = step[0]
            ok, why = backend.supports(n, graph)
            if ok:
                run.append(n)
                continue
            if run:
                self.items.append(Segment(self, run, len(self.items)))
                run = []
            self.fallbacks.append((n, why))
            self.items.append(step)
        if run:
            self.items.append(Segment(self, run, len(self.items)))
        # A segment's outputs: its values that the graph outputs or that later items read.
        later: set = set(graph.outputs)
        for item in reversed(self.items):
            if isinstance(item, Segment):
                produced = {o for n in item.nodes for o in n.outputs}
                item.outputs = [o for n in item.nodes for o in n.outputs if o in later and o in produced]
                later |= set(item.inputs)
            else:
                n = item[0]
                later |= {i for i in n.inputs if i} | {c for r in n.regions.values() for c in r.captures()}
        for item in self.items:
            if isinstance(item, Segment):
                item.build(self, backend)
        self.sessions = [i.session for i in self.items if isinstance(i, Segment)]

    def run(self, feeds, progress=None, attention=None):
        env = dict(self.consts)
        env.update(check_inputs(self.graph, feeds))
        total = len(self.items)
        for k, item in enumerate(self.items):
            if isinstance(item, Segment):
                if item.session is None:
                    continue
                try:
                    res = item.session.run(item.outputs, {i: env[i] for i in item.inputs})
                except Exception as e:
                    raise NpurunError(f"{self.graph.source}: ONNX Runtime ({self.provider}) failed on "
                                      f"nodes {item.nodes[0].label()} ...: {str(e).splitlines()[0][:300]}") from e
                env.update(zip(item.outputs, res))
                label = item.nodes[-1].label()
            else:
                n, fn, attrs, dead = item
                args = [env[nm] if nm else None for nm in n.inputs]
                subs = self.subprograms.get(id(n))
                if subs:
                    attrs = {**attrs, "_regions": {r: (lambda ins, p=p: p.call(ins, env)) for r, p in subs.items()}}
                try:
                    res = fn(*args, **attrs)
                except NpurunError:
                    raise
                except Exception as e:
                    raise NpurunError(f"{self.graph.source}: {n.label()} failed on inputs ({_describe(args)}): "
                                      f"{e.__class__.__name__}: {e}") from e
                res = res if isinstance(res, tuple) else (res,)
                env.update(zip(n.outputs, res))
                label = n.label()
            if progress:
                progress(k + 1, total, label)
        return {nm: np.asarray(env[nm]) if not isinstance(env[nm], (list, type(None))) else env[nm]
                for nm in self.graph.outputs}
