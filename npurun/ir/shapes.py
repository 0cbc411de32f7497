"""Dimensions: static ints or symbols.

A dim is an `int`, a symbol name (`"H"`), an affine expression of one symbol (`"3*H"`,
`"H+2"`, `"2*W-1"`) or `"?"` (unknown). Affine forms cover what CNNs do to a symbolic image
size (same-padded convs keep it, pixel shuffle multiplies it); anything else becomes `"?"`,
and the runtime works with the concrete shapes of the arrays it is given.

A shape itself may be unknown: `None` is a tensor of unknown rank (an If whose branches give
different ranks, a Squeeze without axes of dims not known to be 1). It prints `[*]` (MLIR's
unranked tensor). Ops whose inference needs the rank refuse such an operand (`OpDef.any_rank`).
"""
import math
import re

Dim = int | str
UNKNOWN = "?"

_AFFINE = re.compile(r"^(?:(-?\d+)\*)?([A-Za-z_][A-Za-z0-9_]*)(?:([+-])(\d+))?$")
SYMBOL = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def parse_affine(d: str) -> tuple[int, str, int] | None:
    """`"3*H+2"` -> (3, "H", 2); None when `d` is not an affine form of one symbol."""
    m = _AFFINE.match(d)
    if not m:
        return None
    mul = int(m.group(1)) if m.group(1) else 1
    add = int(m.group(4)) if m.group(4) else 0
    return mul, m.group(2), (-add if m.group(3) == "-" else add)


def format_affine(mul: int, sym: str, add: int) -> Dim:
    if mul == 0:
        return add
    s = sym if mul == 1 else f"{mul}*{sym}"
    if add > 0:
        s += f"+{add}"
    elif add < 0:
        s += f"-{-add}"
    return s


def is_valid_dim(d) -> bool:
    if isinstance(d, bool):
        return False
    if isinstance(d, int):
        return d >= 0
    return isinstance(d, str) and (d == UNKNOWN or parse_affine(d) is not None)


def affine(d: Dim, mul: int = 1, add: int = 0, div: int = 1) -> Dim:
    """(d * mul + add) // div, staying symbolic where the result is still affine."""
    if isinstance(d, int):
        return (d * mul + add) // div
    p = parse_affine(d)
    if p is None:
        return UNKNOWN
    m, sym, a = p
    m, a = m * mul, a * mul + add
    if div != 1:
        if m % div or a % div:
            return UNKNOWN
        m, a = m // div, a // div
    return format_affine(m, sym, a)


def dim_add(a: Dim, b: Dim) -> Dim:
    if isinstance(a, int) and isinstance(b, int):
        return a + b
    if isinstance(b, int):
        return affine(a, add=b)
    if isinstance(a, int):
        return affine(b, add=a)
    pa, pb = parse_affine(a), parse_affine(b)
    if pa and pb and pa[1] == pb[1]:
        return format_affine(pa[0] + pb[0], pa[1], pa[2] + pb[2])
    return UNKNOWN


def dim_mul(a: Dim, b: Dim) -> Dim:
    if isinstance(a, int) and isinstance(b, int):
        return a * b
    if isinstance(b, int):
        return affine(a, mul=b)
    if isinstance(a, int):
        return affine(b, mul=a)
    return UNKNOWN


def numel(shape) -> int | None:
    """Element count, or None while any dim (or the rank) is unknown."""
    if shape is not None and all(isinstance(d, int) for d in shape):
        return math.prod(shape)
    return None


def broadcast(a: tuple, b: tuple) -> tuple | None:
    """NumPy broadcasting of two shapes; None when they cannot broadcast."""
    out = []
    for i in range(1, max(len(a), len(b)) + 1):
        x = a[-i] if i <= len(a) else 1
        y = b[-i] if i <= len(b) else 1
        if x == 1:
            out.append(y)
        elif y == 1 or x == y:
            out.append(x)
        elif isinstance(x, str) or isinstance(y, str):
            out.append(x if isinstance(x, int) else y)  # the static side wins; checked at run time
        else:
            return None
    return tuple(reversed(out))


def bind(shape: tuple | None, actual: tuple, env: dict[str, int]) -> bool:
    """Match a declared shape against an array's shape, binding plain symbols into `env`."""
    if shape is None:  # unknown rank: any array matches
        return True
    if len(shape) != len(actual):
        return False
    for d, n in zip(shape, actual):
        if isinstance(d, int):
            if d != n:
                return False
        elif SYMBOL.match(d):
            if env.setdefault(d, n) != n:
                return False
        elif d != UNKNOWN:
            mul, sym, add = parse_affine(d)
            if sym in env and env[sym] * mul + add != n:
                return False
    return True


def is_static(shape) -> bool:
    """Rank and every dim known."""
    return shape is not None and all(isinstance(d, int) for d in shape)


def merge_shapes(a: tuple | None, b: tuple | None) -> tuple | None:
    """The shape two values agree on (If branches, loop-carried values): dims that differ
    become unknown; ranks that differ, or an unknown one, leave the rank unknown."""
    if a is None or b is None or len(a) != len(b):
        return None
    return tuple(x if x == y else UNKNOWN for x, y in zip(a, b))


def format_shape(shape) -> str:
    if shape is None:
        return "[*]"
    return "[" + ", ".join(str(d) for d in shape) + "]"
