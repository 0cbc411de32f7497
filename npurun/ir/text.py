"""The `.npuir` text format: print a graph, parse it back to an equal graph.

    npuir 1
    graph espcn_x3 weights="espcn_x3.weights.npz"
    input input: [1, 1, H, W] f32 DRAM0
    const conv1.weight: [64, 1, 5, 5] f32 DRAM0
    const shape0: [2] i64 DRAM0 = [1, -1]
    op conv @conv1 (input: [1, 1, H, W] f32 DRAM0, conv1.weight: [64, 1, 5, 5] f32 DRAM0
                    -> t0: [1, 64, H, W] f32 DRAM0) pads=[2, 2, 2, 2]
    output t0: [1, 64, H, W] f32 DRAM0

Every operand carries its type (shape, dtype, memory space), so one `op` line is a graph of
its own, as in the founding document:

    op matmul_f16 (input: [1024, 2048] f16 DRAM0, weight: [2048, 4096] f16 NPU_SRAM,
                   output: [1024, 4096] f16 NPU_SRAM) pipeline=3 burst=256

Without `->`, the op's declared output count splits the operands. Without `input`/`output`
lines, graph inputs are the values nothing produces and outputs the values nothing reads.
Trailing `key=value` pairs are the op's attributes when the op declares them, schedule hints
(`HINT_KEYS`) otherwise. Constants larger than `INLINE_LIMIT` elements live in the weights
file (an .npz keyed by value name); smaller ones are written inline.
"""
from __future__ import annotations

import json
import math
import re

import numpy as np

from ..errors import ParseError
from .dtypes import DTYPES, FLOAT_TYPES, SMALL_FLOAT_TYPES, to_numpy
from .graph import DEFAULT_SPACE, KINDS, Graph, Node, Value
from .ops import HINT_KEYS, OPS, split_precision
from .shapes import is_valid_dim

VERSION = 1
INLINE_LIMIT = 16
# Lists in a literal and region blocks nest at most this deep: the parser recurses on both,
# and a text nested 100,000 deep must be a ParseError, not a RecursionError.
MAX_NESTING = 100
_BARE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-/]*$")

# ------------------------------------------------------------------ printing


def _name(n: str) -> str:
    return n if _BARE.match(n) and n != "_" else json.dumps(n)


def _scalar(v) -> str:
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    if isinstance(v, (float, np.floating)):
        f = float(v)
        return "nan" if math.isnan(f) else ("inf" if f == math.inf else "-inf" if f == -math.inf else repr(f))
    if isinstance(v, str):
        return json.dumps(v)
    raise TypeError(f"cannot print attribute value {v!r}")


def _attr(v) -> str:
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_scalar(x) for x in v) + "]"
    return _scalar(v)


def _operand(g: Graph, name: str) -> str:
    return "_" if not name else f"{_name(name)}: {g.values[name].type_str()}"


def region_key(path: tuple, name: str) -> str:
    """Key of a constant in the weights file: its name, prefixed by the regions it sits in
    (`3.body::w` is constant `w` of the `body` region of node 3)."""
    return "::".join(path + (name,))


def constants(g: Graph, path: tuple = ()):
    """(weights-file key, Value) of every constant, regions included."""
    for v in g.constants():
        yield region_key(path, v.name), v
    for i, n in enumerate(g.nodes):
        for k, r in n.regions.items():
            yield from constants(r, path + (f"{i}.{k}",))


def print_graph(g: Graph, weights_file: str | None = None) -> str:
    """The graph as .npuir text. Large constants are named, not written; see `save`."""
    head = f"graph {_name(g.name)}"
    if weights_file:
        head += f" weights={json.dumps(weights_file)}"
    return "\n".join([f"npuir {VERSION}", head] + _body(g, "")) + "\n"


def _body(g: Graph, pad: str) -> list[str]:
    """Statements of a graph after its header, each line indented by `pad`."""
    lines = [f"input {_operand(g, n)}" for n in g.inputs]
    for v in g.constants():
        line = f"const {_operand(g, v.name)}"
        if v.data.size <= INLINE_LIMIT:
            line += " = " + _attr(v.data.reshape(-1).tolist())
        lines.append(line)
    for n in g.nodes:
        s = f"op {n.full_op}" + (f" @{_name(n.name)}" if n.name else "")
        ins = ", ".join(_operand(g, i) for i in n.inputs)
        outs = ", ".join(_operand(g, o) for o in n.outputs)
        s += f" ({ins} -> {outs})" if ins else f" (-> {outs})"
        for k, v in list(n.attrs.items()) + list(n.hints.items()):
            s += f" {k}={_attr(v)}"
        if n.why:
            s += f" why={json.dumps(n.why)}"
        for k, r in n.regions.items():  # a region is a block: its own statements, indented
            lines.append(s + f" {k}={{")
            lines += [f"  graph {_name(r.name)}"] + ["  " + ln for ln in _body(r, "")]
            s = "}"
        lines.append(s)
    lines += [f"output {_operand(g, n)}" for n in g.outputs]
    # Calibrated ranges last, when every value they name has been declared.
    lines += [f"range {_name(v.name)} " + " ".join(f"{k}={_attr(x)}" for k, x in v.calib.items())
              for v in g.values.values() if v.calib]
    return [pad + ln for ln in lines]


# ------------------------------------------------------------------ parsing

_TOKEN = re.compile(r"""
    (?P<ws>[ \t\r]+|\#[^\n]*)
  | (?P<nl>\n)
  | (?P<str>"(?:[^"\\\n]|\\.)*")
  | (?P<num>-?(?:\d+\.\d*(?:[eE][-+]?\d+)?|\d+[eE][-+]?\d+|\.\d+(?:[eE][-+]?\d+)?|\d+)(?![A-Za-z_]))
  | (?P<arrow>->)
  | (?P<name>[A-Za-z_][A-Za-z0-9_.\-/]*)
  | (?P<punct>[\[\](){},:=@*+?-])
""", re.VERBOSE)


class _Tok:
    __slots__ = ("kind", "text", "line", "col")

    def __init__(self, kind, text, line, col):
        self.kind, self.text, self.line, self.col = kind, text, line, col


def _tokenize(text: str, file: str) -> list[_Tok]:
    toks, pos, line, line_start = [], 0, 1, 0
    opened: list[_Tok] = []  # brackets not yet closed
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m:
            raise ParseError(f"unexpected character {text[pos]!r}", file=file, line=line,
                             col=pos - line_start + 1)
        kind, s = m.lastgroup, m.group()
        col = pos - line_start + 1
        if kind == "nl":
            # Newlines inside ( ) or [ ] continue a statement; inside { } they separate them.
            if not opened or opened[-1].text == "{":
                toks.append(_Tok("nl", s, line, col))
            line, line_start = line + 1, m.end()
        elif kind != "ws":
            tok = _Tok(kind, s, line, col)
            if kind == "punct" and s in "([{":
                opened.append(tok)
                if len(opened) > MAX_NESTING + 2:  # (a region's op line opens '(' and '[' too)
                    raise ParseError(f"nested deeper than {MAX_NESTING} levels (lists or regions)",
                                     file=file, line=line, col=col)
            elif kind == "punct" and s in ")]}" and opened:
                opened.pop()
            toks.append(tok)
        pos = m.end()
    if opened:
        t = opened[-1]
        raise ParseError(f"{t.text!r} is never closed", file=file, line=t.line, col=t.col)
    toks.append(_Tok("nl", "", line, pos - line_start + 1))
    toks.append(_Tok("eof", "", line, pos - line_start + 1))
    return toks


class _Parser:
    def __init__(self, text: str, file: str, weights: dict | None):
        self.file = file
        self.toks = _tokenize(text, file)
        self.i = 0
        self.weights = weights
        self.g = Graph(source=file)
        self.declared_inputs: list[str] | None = None
        self.declared_outputs: list[str] | None = None
        self.where: dict[str, _Tok] = {}  # first mention of each value, for error positions
        self.weights_file: str | None = None
        self.path: tuple = ()  # the regions being parsed, for weights-file keys
        self.depth = 0  # lists and regions open around the current token

    def nest(self, tok: _Tok):
        self.depth += 1
        if self.depth > MAX_NESTING:
            self.error(f"nested deeper than {MAX_NESTING} levels (lists or regions)", tok)

    # --- token helpers
    def peek(self) -> _Tok:
        return self.toks[self.i]

    def next(self) -> _Tok:
        t = self.toks[self.i]
        self.i += 1
        return t

    def string(self, t: _Tok) -> str:
        """A quoted string's value (JSON's escapes); a raw control character or a bad escape
        inside the quotes is a ParseError at the string."""
        try:
            return json.loads(t.text)
        except ValueError as e:
            self.error(f"bad string {t.text[:40]!r}: {e.msg if hasattr(e, 'msg') else e}", t)

    def error(self, msg: str, tok: _Tok | None = None):
        t = tok or self.peek()
        raise ParseError(msg, file=self.file, line=t.line, col=t.col)

    def expect(self, text: str) -> _Tok:
        t = self.next()
        if t.text != text:
            shown = repr(t.text) if t.text else "end of line"
            self.error(f"expected {text!r}, found {shown}", t)
        return t

    def accept(self, text: str) -> bool:
        if self.peek().text == text and self.peek().kind != "str":
            self.i += 1
            return True
        return False

    def name(self, what: str) -> str:
        t = self.next()
        if t.kind == "name":
            return t.text
        if t.kind == "str":
            return self.string(t)
        self.error(f"expected {what}, found {t.text or 'end of line'!r}", t)

    # --- grammar
    def parse(self) -> Graph:
        self.statements()
        return self.finish()

    def statements(self, block: bool = False) -> None:
        """Statements up to the end of the text, or of a region's `{ }` block."""
        while self.peek().kind != "eof":
            t = self.peek()
            if t.kind == "nl":
                self.next()
                continue
            if block and t.text == "}":
                return
            kw = self.next()
            handler = {"npuir": self.p_version, "graph": self.p_graph, "input": self.p_input,
                       "output": self.p_output, "const": self.p_const, "op": self.p_op,
                       "range": self.p_range}.get(kw.text)
            if handler is None or kw.kind != "name":
                self.error(f"expected a statement (npuir, graph, input, const, op, output, range), "
                           f"found {kw.text!r}", kw)
            handler(kw)
            if self.peek().kind != "nl" and not (block and self.peek().text == "}"):
                self.error(f"unexpected {self.peek().text!r} at end of statement")
        if block:
            self.error("a region's '{' is never closed")

    def p_region(self, key: str, node_index: int) -> Graph:
        """A region block: a graph of its own whose inputs and outputs are exactly the declared
        ones; any other value it reads comes from the graphs around it."""
        self.nest(self.peek())
        saved = (self.g, self.declared_inputs, self.declared_outputs, self.where, self.path)
        self.g = Graph(name=key, source=self.file)
        self.declared_inputs, self.declared_outputs, self.where = [], [], {}
        self.path = self.path + (f"{node_index}.{key}",)
        self.statements(block=True)
        self.expect("}")
        region = self.g
        region.inputs, region.outputs = self.declared_inputs, self.declared_outputs
        self.g, self.declared_inputs, self.declared_outputs, self.where, self.path = saved
        self.depth -= 1
        return region

    def p_version(self, kw):
        t = self.next()
        if t.kind != "num" or int(float(t.text)) != VERSION:
            self.error(f"unsupported npuir version {t.text!r}; this npurun reads version {VERSION}", t)

    def p_graph(self, kw):
        self.g.name = self.name("graph name")
        while self.peek().kind == "name":
            key = self.next()
            self.expect("=")
            val = self.next()
            if key.text != "weights" or val.kind != "str":
                self.error('expected weights="FILE" after the graph name', key)
            self.weights_file = self.string(val)

    def p_type(self, name_tok: _Tok):
        kind = []
        while self.peek().kind == "name" and self.peek().text in ("opt", "seq") and len(kind) < 2:
            kind.append(self.next().text)
        kind = " ".join(kind) or "tensor"
        if kind not in KINDS:
            self.error(f"bad value kind {kind!r}; expected opt, seq or opt seq before the shape")
        self.expect("[")
        shape = []
        if self.peek().text == "*" and self.toks[self.i + 1].text == "]":  # `[*]`: rank unknown
            self.i += 2
            shape = None
        while shape is not None and not self.accept("]"):
            start = self.peek()
            parts = []
            while self.peek().text not in (",", "]") and self.peek().kind not in ("nl", "eof"):
                parts.append(self.next().text)
            d = "".join(parts)
            dim = int(d) if re.fullmatch(r"\d+", d) else d
            if not is_valid_dim(dim):
                self.error(f"bad dimension {d!r}: expected a non-negative integer, a symbol, "
                           f"an affine form like 3*H+1, or ? (a shape of unknown rank is [*])", start)
            shape.append(dim)
            if not self.accept(","):
                self.expect("]")
                break
        t = self.next()
        if t.text not in DTYPES:
            self.error(f"unknown dtype {t.text!r}; expected one of {', '.join(DTYPES)}", t)
        space = DEFAULT_SPACE
        if self.peek().kind == "name" and self.peek().text.isupper():
            space = self.next().text
        return (None if shape is None else tuple(shape)), t.text, space, kind

    def typed_value(self, allow_untyped: bool = True) -> str:
        tok = self.peek()
        nm = self.name("a value name")
        if self.accept(":"):
            shape, dtype, space, kind = self.p_type(tok)
            old = self.g.values.get(nm)
            if old is None:
                self.g.values[nm] = Value(nm, shape, dtype, space, kind=kind)
                self.where[nm] = tok
            elif (old.shape, old.dtype, old.space, old.kind) != (shape, dtype, space, kind):
                self.error(f"value {nm!r} has type {old.type_str()} at line "
                           f"{self.where[nm].line} but {Value(nm, shape, dtype, space, kind=kind).type_str()} here", tok)
        elif nm not in self.g.values:
            self.error(f"value {nm!r} needs a type ([shape] dtype space) at its first mention", tok)
        return nm

    def p_input(self, kw):
        self.declared_inputs = (self.declared_inputs or []) + [self.typed_value()]

    def p_output(self, kw):
        self.declared_outputs = (self.declared_outputs or []) + [self.typed_value()]

    def p_const(self, kw):
        tok = self.peek()
        nm = self.typed_value()
        v = self.g.values[nm]
        if v.shape is None or any(not isinstance(d, int) for d in v.shape):
            self.error(f"constant {nm!r} must have a static shape", tok)
        if self.accept("="):
            lit = self.next()
            vals = self.literal(lit)
            vals = vals if isinstance(vals, list) else [vals]
            if len(vals) != math.prod(v.shape):
                self.error(f"constant {nm!r} has {len(vals)} values, its shape "
                           f"{list(v.shape)} needs {math.prod(v.shape)}", lit)
            try:
                v.data = _literal_array(vals, v.dtype).reshape(v.shape)
            except (ValueError, TypeError, OverflowError) as e:
                self.error(f"constant {nm!r}: its values are not {v.dtype} values ({e})", lit)
        else:
            key = region_key(self.path, nm)
            if self.weights is None or key not in self.weights:
                src = self.weights_file or "the weights file"
                self.error(f"constant {nm!r} has no inline value and is missing from {src}", tok)
            arr = np.asarray(self.weights[key])
            want = to_numpy(v.dtype)
            if want == object and arr.dtype.kind == "U":
                arr = arr.astype(object)  # strings are stored as a NumPy unicode array
            elif want.isbuiltin == 2 and arr.dtype.kind == "u" and arr.dtype.itemsize == want.itemsize:
                arr = arr.view(want)  # bf16, f8*, i4, ... are stored as raw unsigned words
            if arr.dtype != want or arr.shape != v.shape:
                self.error(f"constant {nm!r}: weights file holds {arr.dtype} {list(arr.shape)}, "
                           f"text says {v.dtype} {list(v.shape)}", tok)
            v.data = arr

    def p_range(self, kw):
        """`range NAME key=value ...`: a value's calibrated range and quantization parameters."""
        tok = self.peek()
        nm = self.name("a value name")
        if nm not in self.g.values:
            self.error(f"range of {nm!r}: no such value (declare it before its range)", tok)
        calib = {}
        while self.peek().kind == "name":
            key = self.next().text
            self.expect("=")
            calib[key] = self.literal(self.next())
        if not calib:
            self.error(f"range of {nm!r} needs key=value pairs (min=, max=, ...)")
        self.g.values[nm].calib = calib

    def literal(self, t: _Tok):
        if t.text == "[":
            self.nest(t)
            items = []
            while not self.accept("]"):
                items.append(self.literal(self.next()))
                if not self.accept(","):
                    self.expect("]")
                    break
            self.depth -= 1
            return items
        if t.kind == "num":
            return float(t.text) if any(c in t.text for c in ".eE") else int(t.text)
        if t.kind == "str":
            return self.string(t)
        if t.kind == "name" and t.text in ("inf", "nan"):
            return float(t.text)
        if t.text == "-" and self.peek().text == "inf":
            self.next()
            return -math.inf
        self.error(f"expected a number, string or list, found {t.text!r}", t)

    def p_op(self, kw):
        op_tok = self.next()
        if op_tok.kind != "name":
            self.error("expected an op name after 'op'", op_tok)
        base, precision = split_precision(op_tok.text)
        d = OPS.get(base)
        if d is None:
            self.error(f"unknown op {op_tok.text!r}", op_tok)
        node_name = self.name("node name") if self.accept("@") else ""
        self.expect("(")
        operands, outs, arrow = [], [], False
        while not self.accept(")"):
            if self.accept("->"):
                arrow = True
                continue
            if self.accept("_"):
                (outs if arrow else operands).append("")
            else:
                (outs if arrow else operands).append(self.typed_value())
            if not self.accept(","):
                if self.peek().text == "->":
                    continue
                self.expect(")")
                break
        if not arrow:  # the founding form: the op's own output count splits the operands
            n_out = len(d.outputs)
            if len(operands) <= n_out or d.outputs[-1].endswith("*"):
                self.error(f"op {base} needs '->' between inputs and outputs here", op_tok)
            operands, outs = operands[:-n_out], operands[-n_out:]
        node = Node(base, operands, outs, name=node_name, precision=precision)
        while self.peek().kind == "name":
            key = self.next()
            self.expect("=")
            if key.text in d.regions:
                self.expect("{")
                node.regions[key.text] = self.p_region(key.text, len(self.g.nodes))
                continue
            val = self.literal(self.next())
            if key.text == "why" and "why" not in d.attrs:
                if not isinstance(val, str):
                    self.error("why= takes a string (the reason for the node's precision)", key)
                node.why = val
                continue
            if key.text in d.attrs:
                node.attrs[key.text] = val
            elif key.text in HINT_KEYS:
                node.hints[key.text] = val
            else:
                self.error(f"op {base} has no attribute {key.text!r} and it is not a schedule "
                           f"hint; attributes: {', '.join(d.attrs) or 'none'}; hints: "
                           f"{', '.join(HINT_KEYS)}", key)
        self.g.nodes.append(node)

    def finish(self) -> Graph:
        g = self.g
        produced = {o for n in g.nodes for o in n.outputs}
        used = {i for n in g.nodes for i in n.inputs if i}
        g.inputs = self.declared_inputs if self.declared_inputs is not None else [
            nm for nm, v in g.values.items() if nm not in produced and not v.is_const]
        g.outputs = self.declared_outputs if self.declared_outputs is not None else [
            nm for nm in g.values if nm in produced and nm not in used]
        return g


def _literal_array(vals: list, dtype: str) -> np.ndarray:
    """Inline constant values (flat) as an array of `dtype`."""
    want = to_numpy(dtype)
    if want == object:
        if not all(isinstance(x, str) for x in vals):
            raise ValueError("a str constant takes string values")
        out = np.empty(len(vals), dtype=object)
        out[:] = vals
        return out
    # Low-precision floats come from exact float64 values; integers straight from Python ints.
    floaty = dtype in FLOAT_TYPES or dtype in SMALL_FLOAT_TYPES
    return np.array(vals, dtype=np.float64 if floaty else None).astype(want)


def parse(text: str, *, file: str = "<text>", weights: dict | None = None) -> Graph:
    """Parse .npuir text. `weights` maps constant names to arrays (see `load`)."""
    return _Parser(text, file, weights).parse()


def weights_file_of(text: str) -> str | None:
    m = re.search(r'^\s*graph\s+\S+\s+weights=("(?:[^"\\]|\\.)*")', text, re.MULTILINE)
    try:
        return json.loads(m.group(1)) if m else None
    except ValueError:  # (parse() says what is wrong with the string, where)
        return None
