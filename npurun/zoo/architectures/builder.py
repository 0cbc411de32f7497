"""A small graph builder for the calibration architectures: NPU-IR graphs built op by op with
random weights (only shapes matter for timing; random, not zero, so functional checks mean
something). Shapes are inferred by the op vocabulary as each node is added.

`lazy=True` is for models too large to hold as float32 (a 7B LLM, SD's UNet): each weight is
one random row broadcast over its leading dims (a read-only view: O(last dim) memory), still
random and non-zero, the right shape for every rule that reads shapes."""
from __future__ import annotations

import numpy as np

from ...ir.graph import DEFAULT_SPACE, Graph, Node, Value
from ...ir.ops import infer_node


class Builder:
    def __init__(self, name: str, seed: int = 0, lazy: bool = False):
        self.g = Graph(name=name, source=f"<architecture {name}>")
        self.rng = np.random.default_rng(seed)
        self.count: dict[str, int] = {}
        self.lazy = lazy

    # ------------------------------------------------------------ plumbing
    def _name(self, base: str) -> str:
        k = self.count.get(base, 0) + 1
        self.count[base] = k
        return f"{base}{k}"

    def input(self, name: str, shape, dtype: str = "f32") -> str:
        self.g.add_value(Value(name, tuple(shape), dtype))
        self.g.inputs.append(name)
        return name

    def weight(self, shape, scale: float | None = None, base: str = "w") -> str:
        fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else int(shape[0])
        s = scale if scale is not None else 1.0 / np.sqrt(max(fan_in, 1))
        if self.lazy:
            row = self.rng.standard_normal(shape[-1], dtype=np.float32) * np.float32(s)
            name = self._name(base)
            self.g.add_value(Value(name, tuple(shape), "f32", DEFAULT_SPACE, np.broadcast_to(row, tuple(shape))))
            return name
        arr = (self.rng.standard_normal(shape, dtype=np.float32) * np.float32(s))
        return self.g.const(self._name(base), arr).name

    def ints(self, values) -> str:
        return self.g.const(self._name("c"), np.asarray(values, dtype=np.int64)).name

    def floats(self, values) -> str:
        return self.g.const(self._name("c"), np.asarray(values, dtype=np.float32)).name

    def node(self, op: str, inputs, n_out: int = 1, **attrs) -> str | list[str]:
        name = self._name(op)
        outs = [f"{name}_y{i}" if n_out > 1 else f"{name}_y" for i in range(n_out)]
        node = Node(op, list(inputs), outs, attrs, name=name)
        for o, (shape, dtype, kind) in zip(outs, infer_node(node, self.g.values)):
            self.g.add_value(Value(o, tuple(shape), dtype, kind=kind))
        self.g.nodes.append(node)
        return outs if n_out > 1 else outs[0]

    def output(self, *names: str) -> Graph:
        self.g.outputs.extend(names)
        return self.g

    def shape(self, x: str) -> tuple:
        return self.g.values[x].shape

    # ------------------------------------------------------------ layers
    def conv(self, x, cout, k=3, s=1, p=None, groups=1, bias=True, dilation=1, act=None, frozen_bn=False):
        """A conv (+ bias) and its activation; `frozen_bn`: no bias, then a per-channel Mul and
        Add before the activation (a frozen BatchNorm, x * scale + shift, as exporters write it)."""
        cin = self.shape(x)[1]
        ks = (k, k) if isinstance(k, int) else tuple(k)
        nd = len(self.shape(x)) - 2
        if nd == 1:
            ks = ks[:1]
        pads = [(kk - 1) * dilation // 2 for kk in ks] if p is None else ([p] * nd if isinstance(p, int) else list(p))
        w = self.weight((cout, cin // groups, *ks))
        ins = [x, w] + ([self.weight((cout,), 0.1, "b")] if bias and not frozen_bn else [])
        attrs = dict(strides=[s] * nd, pads=pads + pads, group=groups)
        if dilation != 1:
            attrs["dilations"] = [dilation] * nd
        y = self.node("conv", ins, **attrs)
        if frozen_bn:
            per_channel = (1, cout) + (1,) * nd
            y = self.add(self.mul(y, self.weight(per_channel, 0.5, "bn")), self.weight(per_channel, 0.1, "bn"))
        return self.act(y, act)

    def act(self, x, act):
        if act is None:
            return x
        if act == "relu6":
            return self.node("clip", [x, self.floats(0.0), self.floats(6.0)])
        if act == "prelu":
            c = self.shape(x)[1]
            return self.node("prelu", [x, self.weight((c, 1, 1), 0.1, "a")])
        if act == "lrelu":
            return self.node("leaky_relu", [x], alpha=0.2)
        if act == "silu":
            return self.node("mul", [x, self.node("sigmoid", [x])])
        return self.node(act, [x])

    def bn(self, x):
        c = self.shape(x)[1]
        return self.node("batch_normalization", [x, self.weight((c,), 0.1, "bn"), self.weight((c,), 0.1, "bn"),
                                                 self.weight((c,), 0.1, "bn"), self.floats(np.ones(c))])

    def add(self, a, b):
        return self.node("add", [a, b])

    def mul(self, a, b):
        return self.node("mul", [a, b])

    def concat(self, xs, axis=1):
        return self.node("concat", xs, axis=axis)

    def maxpool(self, x, k, s, p=0):
        return self.node("max_pool", [x], kernel_shape=[k, k], strides=[s, s], pads=[p] * 4)

    def gap(self, x):
        return self.node("global_average_pool", [x])

    def flatten(self, x):
        return self.node("flatten", [x], axis=1)

    def linear(self, x, cout, bias=True):
        """x is (..., K): a matmul by a (K, cout) weight, plus bias."""
        k = self.shape(x)[-1]
        y = self.node("matmul", [x, self.weight((k, cout))])
        return self.add(y, self.weight((cout,), 0.1, "b")) if bias else y

    def layer_norm(self, x, bias=True):
        d = self.shape(x)[-1]
        ins = [x, self.floats(np.ones(d))] + ([self.floats(np.zeros(d))] if bias else [])
        return self.node("layer_normalization", ins, axis=-1)

    def rms_norm(self, x):
        return self.node("rms_normalization", [x, self.floats(np.ones(self.shape(x)[-1]))], axis=-1)

    def group_norm(self, x, groups=32):
        c = self.shape(x)[1]
        return self.node("group_normalization", [x, self.floats(np.ones(c)), self.floats(np.zeros(c))],
                         num_groups=groups, epsilon=1e-5)

    def reshape(self, x, shape):
        return self.node("reshape", [x, self.ints(shape)])

    def transpose(self, x, perm):
        return self.node("transpose", [x], perm=list(perm))

    def upsample(self, x, factor):
        return self.node("resize", [x, "", self.floats([1, 1, factor, factor])], mode="nearest")

    def d2s(self, x, b):
        return self.node("depth_to_space", [x], blocksize=b, mode="DCR")
