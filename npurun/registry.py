"""`npurun.register_op`: add an op to npurun from outside, the programmable "tensor shader" of
the founding document (4.2). docs/adding-ops.md walks through one end to end.

    npurun.register_op("swish2", domain="my.ops", inputs=["x"], attrs={"beta": 1.0},
                       groups={"elementwise", "unary"}, shape="same", macs=4,
                       reference=lambda x, *, beta: x / (1 + np.exp(-beta * x)))

One registration drives the machinery npurun's own ops use, so there is one vocabulary:

- `npurun.ir.ops.op(...)` declares the op (`my.ops.swish2`: operands, attributes, groups,
  shape/dtype rule, cost); `.npuir` text prints and parses it by that name, the verifier checks
  nodes of it, passes ask its groups (`"elementwise" in OPS[n.op].groups`);
- `npurun.frontend.onnx.converters.converter(...)` maps the ONNX node (`Swish2` of domain
  `my.ops`, opsets `since`..`until`) onto it;
- the reference kernel goes into the reference backend's KERNELS; a `cpu` kernel into the cpu
  backend's FACTORIES (without one, the cpu backend runs the reference kernel and `npurun
  ops-report` says so); a `torch` kernel into the torch backend's KERNELS;
- npusim (`npurun estimate`) and `npurun.ir.cost` cost it from `macs`, `bytes`, `unit` and
  `vector_ops`.

A spec that cannot work is refused at registration with a RegistrationError naming the op and
what was expected; a node that breaks the shape rule is a VerifyError naming the node.
"""
from __future__ import annotations

import inspect
import re
import sys
from dataclasses import dataclass, field
from typing import Callable

from .errors import NpurunError, RegistrationError, VerifyError
from .ir.dtypes import DTYPES
from .ir.ops import HINT_KEYS, OPS, PRECISIONS, REQUIRED, op as _declare
from .ir.shapes import broadcast, is_valid_dim

__all__ = ["REQUIRED", "RegisteredOp", "custom_op", "ir_name", "load_op_modules", "register_op",
           "registered_ops", "unregister_op"]

_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
_DOMAIN = re.compile(r"^[A-Za-z][A-Za-z0-9_]*(\.[A-Za-z][A-Za-z0-9_]*)*$")
_ONNX_OP = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")
_ROLE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*[?*]?$")
_ONNX_DOMAINS = ("", "ai.onnx")
UNITS = ("vector", "matrix")
SHAPE_RULES = ("same", "broadcast")


@dataclass(frozen=True)
class RegisteredOp:
    """What register_op recorded: the IR op name and where it comes from in ONNX."""
    name: str  # the IR op name: `domain.name` (`com.microsoft.qlinear_add`), or `name` for ai.onnx
    domain: str
    onnx_op: str
    since: int
    until: int | None
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: dict = field(default_factory=dict)
    groups: frozenset = frozenset()
    kernels: tuple[str, ...] = ("reference",)  # the backends it has kernels for


_REGISTERED: dict[str, RegisteredOp] = {}
_CONVERTERS: dict[str, tuple] = {}  # IR op name -> (CONVERTERS key, the converter function)


def ir_name(name: str, domain: str = "") -> str:
    """The op's name in the IR and in .npuir text: `domain.name`, or `name` in ai.onnx."""
    return name if domain in _ONNX_DOMAINS else f"{domain}.{name}"


def register_op(name: str, *, reference: Callable, domain: str = "", onnx_op: str | None = None,
                since: int = 1, until: int | None = None, inputs=("x",), outputs=("y",),
                attrs: dict | None = None, groups=(), dtypes: dict | None = None,
                shape: str | Callable = "same", macs: float | Callable | None = None,
                bytes: Callable | None = None, unit: str = "vector", vector_ops: float | None = None,  # noqa: A002
                cpu: Callable | None = None, cpu_factory: Callable | None = None,
                torch: Callable | None = None, convert: Callable | None = None,
                replace: bool = False, any_rank: bool = False) -> RegisteredOp:
    """Register an op; returns what was recorded (its IR name is `.name`).

    name        lowercase snake case (`swish2`); the IR op is `domain.name` (`my.ops.swish2`)
    domain      its ONNX domain (`com.microsoft`, `my.ops`; "" is ai.onnx)
    onnx_op     its ONNX op_type (default: `name` in CamelCase, `swish2` -> `Swish2`)
    since/until the domain's opsets the ONNX op is taken from (until None: every later one)
    inputs      operand roles in order; `b?` optional, `xs*` a variadic tail
    outputs     result roles; optional trailing ones end in `?`
    attrs       attribute name -> default (`npurun.REQUIRED` for none); ONNX attribute names
    groups      what passes may ask (`elementwise`, `unary`, `binary`, `mac`, `norm`, ...)
    dtypes      operand role -> allowed dtypes (`{"x": ("f32", "f16")}`), checked per node
    shape       "same" (each result has the first present operand's type), "broadcast" (the
                operands' broadcast shape, the first present operand's dtype) or `rule(ins, attrs) -> [(shape,
                dtype), ...]`, `ins` the operand Values (`.shape`, `.dtype`, `.data` for a
                constant) or None where absent; raise ValueError to refuse a node (a rule
                with a `node` parameter also gets the node, e.g. for npurun's own helpers)
    macs        multiply-accumulates: a number per element of the first result, or
                `macs(attrs, in_shapes, out_shapes) -> int`
    bytes       `bytes(attrs, ins, outs) -> int` with (shape, dtype) pairs (None if absent);
                default: every operand read and every result written once
    unit        npusim's compute unit: "matrix" (MACs on the MAC array) or "vector"
    vector_ops  vector-unit work per result element in MAC-equivalents (unit "vector"; default:
                `macs` where given, else 1)
    reference   the NumPy kernel: `fn(*operands, **attrs)` -> an array or a tuple of arrays
                (None for an absent optional operand; every attribute, defaults merged)
    cpu         a faster kernel of the same signature for the cpu backend (or `cpu_factory`:
                `factory(program) -> kernel`, the program giving `threads` and `pool`)
    torch       a PyTorch kernel of the same signature on torch tensors (imports PyTorch)
    convert     `convert(ctx)` for an ONNX node that does not map 1:1 onto the op (see
                npurun/frontend/onnx/context.py); default: operands, results and attributes as is
    replace     allow registering again a name this API registered before
    any_rank    the shape rule takes operands of unknown rank (their `.shape` None; e.g. a
                conv infers its input's rank from the weight's); else such a node is refused
    """
    op_name = ir_name(name, domain)
    where = f"register_op({op_name!r})"
    spec = _check_spec(where, name, domain, onnx_op, since, until, inputs, outputs, attrs, groups,
                       dtypes, shape, macs, bytes, unit, vector_ops, reference, cpu, cpu_factory,
                       torch, convert)
    onnx_op = onnx_op or _camel(name)
    if op_name in OPS:
        if op_name not in _REGISTERED:
            raise RegistrationError(f"{where}: {op_name} is one of npurun's own ops; choose another "
                                    f"name or domain")
        if not replace:
            raise RegistrationError(f"{where}: {op_name} is already registered; pass replace=True "
                                    f"to register it again")
        unregister_op(op_name)
    _check_converter_free(where, domain, onnx_op, since, until)
    inputs, outputs, attrs = tuple(inputs), tuple(outputs), dict(attrs or {})
    groups = frozenset(groups)

    _declare(op_name, inputs, outputs, attrs, groups, macs=spec["macs"], domain=domain,
             bytes=bytes, unit=unit, vector_ops=float(vector_ops or 0), any_rank=bool(any_rank))(
        _infer(op_name, inputs, shape, dict(dtypes or {})))
    from .backends.reference.kernels import KERNELS
    KERNELS[op_name] = reference
    kernels = ["reference"]
    if cpu is not None or cpu_factory is not None:
        from .backends.cpu import CPU_KERNELS
        from .backends.cpu.ops import FACTORIES
        FACTORIES[op_name] = cpu_factory or (lambda program, fn=cpu: fn)
        CPU_KERNELS.add(op_name)
        kernels.append("cpu")
    if torch is not None:
        from .backends.torch.kernels import KERNELS as TORCH
        TORCH[op_name] = torch
        kernels.append("torch")
    fn = _converter(op_name, domain, since, until, attrs, convert)
    from .frontend.onnx.converters import converter
    converter(onnx_op, since=since, domain="" if domain in _ONNX_DOMAINS else domain)(fn)
    _CONVERTERS[op_name] = (("" if domain in _ONNX_DOMAINS else domain, onnx_op), fn)
    rec = RegisteredOp(op_name, domain, onnx_op, since, until, inputs, outputs, attrs, groups,
                       tuple(kernels))
    _REGISTERED[op_name] = rec
    return rec


def custom_op(name: str, **spec):
    """register_op as a decorator of the reference kernel, which it returns unchanged (with
    `.op`, the RegisteredOp):

        @npurun.custom_op("swish2", domain="my.ops", attrs={"beta": 1.0}, groups={"elementwise"})
        def swish2(x, *, beta):
            return x / (1 + np.exp(-beta * x))
    """
    def wrap(fn):
        fn.op = register_op(name, reference=fn, **spec)
        return fn
    return wrap


def registered_ops() -> dict[str, RegisteredOp]:
    """Every op registered through this API, by IR name."""
    return dict(_REGISTERED)


def unregister_op(op_name: str) -> None:
    """Remove an op this API registered (its declaration, kernels and converter)."""
    if op_name not in _REGISTERED:
        raise RegistrationError(f"unregister_op({op_name!r}): not an op registered through "
                                f"npurun.register_op")
    from .backends.reference.kernels import KERNELS
    from .frontend.onnx.converters import CONVERTERS
    del _REGISTERED[op_name]
    OPS.pop(op_name, None)
    KERNELS.pop(op_name, None)
    from .backends.cpu import CPU_KERNELS
    from .backends.cpu.ops import FACTORIES
    FACTORIES.pop(op_name, None)
    CPU_KERNELS.discard(op_name)
    torch_kernels = sys.modules.get("npurun.backends.torch.kernels")
    if torch_kernels is not None:
        torch_kernels.KERNELS.pop(op_name, None)
    key, fn = _CONVERTERS.pop(op_name)
    CONVERTERS[key] = [(s, f) for s, f in CONVERTERS.get(key, []) if f is not fn]
    if not CONVERTERS[key]:
        del CONVERTERS[key]


def load_op_modules(specs) -> list[str]:
    """Import modules that register ops, so the command line sees them (`npurun --ops my_ops
    ...`, or NPURUN_OPS=my_ops,other.py): each is a module name or a path to a .py file."""
    import importlib
    import importlib.util
    from pathlib import Path
    loaded = []
    for spec in specs:
        spec = spec.strip()
        if not spec:
            continue
        try:
            if spec.endswith(".py"):
                path = Path(spec)
                if not path.is_file():
                    raise RegistrationError(f"op module {spec}: no such file")
                if _imported(path):  # before (`import my_ops`, or a second command in one process)
                    loaded.append(spec)
                    continue
                name = f"npurun_ops_{path.stem}"
                mod_spec = importlib.util.spec_from_file_location(name, path)
                mod = importlib.util.module_from_spec(mod_spec)
                sys.modules[mod_spec.name] = mod
                mod_spec.loader.exec_module(mod)
            else:
                importlib.import_module(spec)
        except NpurunError:
            raise
        except Exception as e:  # noqa: BLE001 -- any failure of the user's module, named
            raise RegistrationError(f"op module {spec}: cannot import it ({e.__class__.__name__}: {e})") from None
        loaded.append(spec)
    return loaded


def _imported(path) -> bool:
    want = path.resolve()
    for mod in list(sys.modules.values()):
        f = getattr(mod, "__file__", None)
        if f and f.endswith(path.name):
            from pathlib import Path
            if Path(f).resolve() == want:
                return True
    return False


# ------------------------------------------------------------------ checking a spec

def _camel(name: str) -> str:
    return "".join(p[:1].upper() + p[1:] for p in name.split("_"))


def _fail(where, msg):
    raise RegistrationError(f"{where}: {msg}")


def _check_spec(where, name, domain, onnx_op, since, until, inputs, outputs, attrs, groups, dtypes,
                shape, macs, nbytes, unit, vector_ops, reference, cpu, cpu_factory, torch, convert):
    """Refuse a spec that could not work, naming the field; returns the normalized cost."""
    if not isinstance(name, str) or not _NAME.match(name):
        _fail(where, f"name {name!r} must be lowercase snake case (letters, digits, _), e.g. 'swish2'")
    base, _, suffix = name.rpartition("_")
    if base and suffix in PRECISIONS:
        _fail(where, f"name {name!r} ends in a precision suffix (_{suffix}); .npuir text reads "
                     f"{name} as {base} at precision {suffix}")
    if not isinstance(domain, str) or domain and not _DOMAIN.match(domain):
        _fail(where, f"domain {domain!r} must be dotted identifiers such as 'com.microsoft' ('' is ai.onnx)")
    if onnx_op is not None and (not isinstance(onnx_op, str) or not _ONNX_OP.match(onnx_op)):
        _fail(where, f"onnx_op {onnx_op!r} must be an ONNX op_type such as 'QLinearAdd'")
    if not isinstance(since, int) or since < 1 or until is not None and (not isinstance(until, int) or until < since):
        _fail(where, f"opset range since={since!r} until={until!r}: expected integers with 1 <= since <= until")
    roles = _check_roles(where, "inputs", inputs)
    _check_roles(where, "outputs", outputs, allow_variadic=False)
    if not outputs:
        _fail(where, "outputs: an op produces at least one result")
    if attrs is not None and (not isinstance(attrs, dict) or not all(isinstance(k, str) and k.isidentifier()
                                                                      for k in attrs)):
        _fail(where, "attrs must map attribute names (identifiers) to defaults (npurun.REQUIRED for none)")
    for k in attrs or {}:  # .npuir text reads these after an op as its reason and schedule hints
        if k == "why" or k in HINT_KEYS or k.startswith("_"):
            _fail(where, f"attribute name {k!r} is reserved (why=, schedule hints {', '.join(HINT_KEYS)}, _private)")
    if isinstance(groups, str) or not all(isinstance(g, str) and _NAME.match(g) for g in groups):
        _fail(where, f"groups must be a set of lowercase names such as {{'elementwise', 'unary'}}, got {groups!r}")
    for role, allowed in (dtypes or {}).items():
        if role not in roles:
            _fail(where, f"dtypes names operand {role!r}, which is not one of the inputs {list(inputs)}")
        bad = [t for t in ([allowed] if isinstance(allowed, str) else allowed) if t not in DTYPES]
        if bad:
            _fail(where, f"dtypes for {role!r}: unknown dtype(s) {bad}; expected some of {', '.join(DTYPES)}")
    if not (callable(shape) or shape in SHAPE_RULES):
        _fail(where, f"shape must be 'same', 'broadcast' or a rule(ins, attrs) -> [(shape, dtype)], got {shape!r}")
    if macs is not None and not callable(macs) and (isinstance(macs, bool) or not isinstance(macs, (int, float))
                                                     or macs < 0):
        _fail(where, f"macs must be a number per result element or macs(attrs, in_shapes, out_shapes), got {macs!r}")
    if nbytes is not None and not callable(nbytes):
        _fail(where, f"bytes must be bytes(attrs, ins, outs) -> int, got {nbytes!r}")
    if unit not in UNITS:
        _fail(where, f"unit {unit!r}: expected one of {', '.join(UNITS)}")
    if vector_ops is not None and (isinstance(vector_ops, bool) or not isinstance(vector_ops, (int, float))
                                   or vector_ops <= 0):
        _fail(where, f"vector_ops must be a positive number, got {vector_ops!r}")
    if not callable(reference):
        _fail(where, "reference must be the op's NumPy kernel, fn(*operands, **attrs)")
    for what, fn in (("reference", reference), ("cpu", cpu), ("torch", torch)):
        if fn is not None:
            _check_kernel(where, what, fn, inputs, attrs or {})
    for what, fn in (("cpu_factory", cpu_factory), ("convert", convert)):
        if fn is not None and not callable(fn):
            _fail(where, f"{what} must be callable")
    if cpu is not None and cpu_factory is not None:
        _fail(where, "give cpu or cpu_factory, not both")
    per_element = None if macs is None or callable(macs) else float(macs)
    if per_element is not None:
        macs = lambda a, ins, outs, k=per_element: int(k * _numel(outs[0]))  # noqa: E731
    return {"macs": macs}


def _numel(shape) -> int:
    n = 1
    for d in shape or ():
        n *= d
    return n


def _check_roles(where, what, roles, allow_variadic=True) -> set:
    if isinstance(roles, str) or not all(isinstance(r, str) and _ROLE.match(r) for r in roles):
        _fail(where, f"{what} must be a list of operand names such as ['x', 'bias?'], got {roles!r}")
    names = [r.rstrip("?*") for r in roles]
    if len(set(names)) != len(names):
        _fail(where, f"{what} repeat a name: {list(roles)}")
    for i, r in enumerate(roles):
        if r.endswith("*") and (not allow_variadic or i != len(roles) - 1):
            _fail(where, f"{what}: only the last input may be variadic ('{r}')")
    if what == "outputs":
        first_opt = next((i for i, r in enumerate(roles) if r.endswith("?")), len(roles))
        if any(not r.endswith("?") for r in roles[first_opt:]):
            _fail(where, f"outputs: optional results ('?') must come last, got {list(roles)}")
    return set(names)


def _check_kernel(where, what, fn, inputs, attrs) -> None:
    """The kernel must accept every operand positionally and every attribute by keyword."""
    if not callable(fn):
        _fail(where, f"{what} kernel must be callable")
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # a builtin without a signature: trust it
    try:
        sig.bind(*[None] * len(inputs), **{k: None for k in attrs})
    except TypeError as e:
        shown = ", ".join(r.rstrip("?*") for r in inputs) + (", *, " + ", ".join(attrs) if attrs else "")
        _fail(where, f"{what} kernel {getattr(fn, '__name__', fn)!r} cannot be called as fn({shown}): {e}")


def _check_converter_free(where, domain, onnx_op, since, until) -> None:
    from .frontend.onnx.converters import CONVERTERS
    key = ("" if domain in _ONNX_DOMAINS else domain, onnx_op)
    mine = {}  # converter function -> the registration it belongs to
    for rec in _REGISTERED.values():
        k, fn = _CONVERTERS[rec.name]
        if k == key:
            mine[fn] = rec
    for s, fn in CONVERTERS.get(key, []):
        rec = mine.get(fn)
        if rec is None:
            _fail(where, f"ONNX op {onnx_op} of domain {domain or 'ai.onnx'} already has one of "
                         f"npurun's own converters")
        hi = rec.until if rec.until is not None else float("inf")
        if since <= hi and (until is None or until >= rec.since):
            _fail(where, f"ONNX op {onnx_op} of domain {domain or 'ai.onnx'} opsets {since}..{until or ''} "
                         f"overlap those of {rec.name} ({rec.since}..{rec.until or ''})")


# ------------------------------------------------------------------ what the registration drives

def _infer(op_name: str, inputs: tuple, rule, dtypes: dict):
    """The op's inference for npurun.ir.ops: operands present and of allowed dtypes, then the
    rule, its result checked and cut to the node's outputs."""
    required = [i for i, r in enumerate(inputs) if not r.endswith(("?", "*"))]

    def infer(node, a, ins):
        for i in required:
            if i >= len(ins) or ins[i] is None:
                raise VerifyError(f"{node.label()}: required operand {i} ({inputs[i]}) is absent")
        for i, v in enumerate(ins):
            role = inputs[min(i, len(inputs) - 1)].rstrip("?*")
            allowed = dtypes.get(role)
            if v is not None and allowed and v.dtype not in ([allowed] if isinstance(allowed, str) else allowed):
                raise VerifyError(f"{node.label()}: operand {role} ({node.inputs[i]!r}) has dtype {v.dtype}; "
                                  f"{op_name} expects {' or '.join(allowed) if not isinstance(allowed, str) else allowed}")
        try:
            out = _apply_rule(rule, ins, a, len(node.outputs), node)
        except NpurunError as e:  # npurun's own helpers name the node already
            msg = str(e)
            raise VerifyError(msg if msg.startswith(node.label()) else f"{node.label()}: {msg}") from None
        except ValueError as e:
            raise VerifyError(f"{node.label()}: {e}") from None
        except Exception as e:  # noqa: BLE001 -- a bug in a user's rule, named as such
            raise VerifyError(f"{node.label()}: the shape rule of {op_name} raised "
                              f"{e.__class__.__name__}: {e}") from None
        return _checked(node, op_name, out)
    return infer


def _apply_rule(rule, ins, a, n_out, node):
    present = [v for v in ins if v is not None]  # "same" and "broadcast" follow the first present
    if rule == "same":
        return [(present[0].shape, present[0].dtype)] * n_out
    if rule == "broadcast":
        shape = ()
        for v in present:
            shape = broadcast(shape, v.shape)
            if shape is None:
                raise ValueError("operand shapes " + ", ".join(str(list(v.shape)) for v in present)
                                 + " do not broadcast")
        return [(shape, present[0].dtype)] * n_out
    if "node" in _params(rule):  # a rule may take the node, for helpers that name it
        return list(rule(ins, a, node=node))
    return list(rule(ins, a))


def _params(fn) -> tuple:
    try:
        return tuple(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return ()


def _checked(node, op_name, out) -> list:
    if len(out) < len(node.outputs):
        raise VerifyError(f"{node.label()}: the shape rule of {op_name} gave {len(out)} result type(s) "
                          f"for {len(node.outputs)} output(s)")
    res = []
    for r in out[:len(node.outputs)]:
        if not isinstance(r, (tuple, list)) or len(r) not in (2, 3):
            raise VerifyError(f"{node.label()}: the shape rule of {op_name} must give (shape, dtype) "
                              f"pairs, got {r!r}")
        shape, dtype = (None if r[0] is None else tuple(r[0])), r[1]  # None: rank unknown
        if dtype not in DTYPES or (shape is not None and not all(is_valid_dim(d) for d in shape)):
            raise VerifyError(f"{node.label()}: the shape rule of {op_name} gave an invalid type "
                              f"{'[*]' if shape is None else list(shape)} {dtype!r}")
        res.append((shape, dtype) + tuple(r[2:]))
    return res


def _converter(op_name: str, domain: str, since: int, until: int | None, attrs: dict, convert):
    """The ONNX converter: the op's opset range, then `convert` or the 1:1 mapping."""
    from .frontend.onnx.context import ConvertError

    def convert_node(ctx):
        if until is not None and ctx.opset > until:
            raise ConvertError(f"opset {ctx.opset} of domain {domain or 'ai.onnx'} is past the "
                               f"opsets {since}..{until} registered for {op_name}")
        try:
            return _convert(ctx)
        except (ConvertError, NpurunError):
            raise
        except Exception as e:  # noqa: BLE001 -- e.g. the reference kernel folding constant operands
            raise ConvertError(f"converting it failed ({e.__class__.__name__}: {e}); a node whose operands are "
                               f"all constants is computed at import by its reference kernel") from None

    def _convert(ctx):
        if convert is not None:
            return convert(ctx)
        unknown = [k for k in ctx.attrs if k not in attrs]
        if unknown:
            raise ConvertError(f"attribute(s) {', '.join(unknown)} not declared by {op_name} "
                               f"(it takes {', '.join(attrs) or 'none'})")
        missing = [k for k, v in attrs.items() if v is REQUIRED and k not in ctx.attrs]
        if missing:
            raise ConvertError(f"missing required attribute(s) {', '.join(missing)}")
        outs = list(ctx.node.output)
        while outs and not outs[-1]:
            outs.pop()
        # A result the model skips in the middle (""): the node still names a value for it.
        outs = [o or ctx.fresh("unused") for o in outs]
        ctx.emit(op_name, ctx.inputs(), outs, **ctx.attrs)
    convert_node.__name__ = f"convert_{op_name.replace('.', '_')}"
    return convert_node
