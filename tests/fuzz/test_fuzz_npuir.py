"""Fuzz target: `.npuir` text -> parse -> verify -> run. Seeds are every .npuir in the tree
and printed corpus graphs (regions, sequences, inline constants). Mutations are grammar-aware
(tokens of the seed deleted, repeated, swapped or replaced by tokens of the language: keywords,
brackets, dtypes, op names, attribute keys, extreme numbers), byte-level, or nesting 10^3 to
10^5 deep (lists in a constant, region blocks, brackets in a type). Pass: a graph that runs,
or an NpurunError (a ParseError names file:line:col)."""
from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import fuzz_seeds
import fuzzkit
from mutate import apply as apply_bytes
from mutate import _EDIT

TOKEN = re.compile(r'"(?:[^"\\\n]|\\.)*"|->|[A-Za-z_][A-Za-z0-9_.\-/]*|-?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|\s+|.',
                   re.S)


def _vocabulary() -> list[str]:
    from npurun.ir.dtypes import DTYPES
    from npurun.ir.ops import HINT_KEYS, OPS
    ops = sorted(OPS)
    attrs = sorted({k for d in OPS.values() for k in d.attrs} | set(HINT_KEYS) | {"why", "weights"})
    return (["npuir", "graph", "input", "output", "const", "op", "range", "->", "(", ")", "[", "]", "{", "}",
             "=", ":", ",", "@", "_", "*", "?", "+", "\n", " ", "#", '"', "opt", "seq", "DRAM0", "NPU_SRAM",
             "1e999", "-1", "0", "9223372036854775808", "18446744073709551584", "nan", "-inf", "3*H+1", "H",
             '"../x.npz"', '"/etc/passwd"', '"\\u0000"', "body={", "then_branch={", "[*]"]
            + list(DTYPES) + ops + attrs)


_TOKEN_EDIT = st.one_of(
    st.tuples(st.just("delete"), st.integers(0, 10**6), st.integers(1, 4)),
    st.tuples(st.just("repeat"), st.integers(0, 10**6), st.integers(1, 4), st.integers(1, 3)),
    st.tuples(st.just("swap"), st.integers(0, 10**6), st.integers(0, 10**6)),
    st.tuples(st.just("replace"), st.integers(0, 10**6), st.integers(0, 10**6)),
    st.tuples(st.just("insert"), st.integers(0, 10**6), st.integers(0, 10**6)),
)


def token_mutate(text: str, edits, vocab: list[str]) -> str:
    toks = TOKEN.findall(text)
    for e in edits:
        if not toks:
            toks = ["npuir"]
        kind, i = e[0], e[1] % len(toks)
        if kind == "delete":
            del toks[i:i + e[2]]
        elif kind == "repeat":
            toks[i:i] = toks[i:i + e[2]] * e[3]
        elif kind == "swap":
            j = e[2] % len(toks)
            toks[i], toks[j] = toks[j], toks[i]
        elif kind == "replace":
            toks[i] = vocab[e[2] % len(vocab)]
        elif kind == "insert":
            toks.insert(i, vocab[e[2] % len(vocab)])
    return "".join(toks)


def deep(kind: str, depth: int) -> str:
    """A text nested `depth` deep in one of the grammar's nesting places."""
    head = "npuir 1\ngraph deep\ninput x: [1] f32 DRAM0\n"
    if kind == "list":
        return head + "const c: [1] f32 DRAM0 = " + "[" * depth + "1" + "]" * depth + "\n"
    if kind == "region":
        body = "op if (x: [1] f32 DRAM0 -> y: [1] f32 DRAM0) then_branch={\n"
        return head + body * depth + "}\n" * depth
    if kind == "type":
        return head + "input y: " + "[" * depth + "1" + "]" * depth + " f32\n"
    if kind == "parens":
        return head + "op relu " + "(" * depth + "x" + ")" * depth + "\n"
    return head + "range x min=" + "[" * depth + "]" * depth + "\n"


def fuzz(n: int, stats: fuzzkit.Stats) -> None:
    import npurun
    from npurun.ir import parse, verify
    seeds = fuzz_seeds.npuir_seeds()
    vocab = _vocabulary()
    exe = npurun.Executor("reference", parallelism=1)

    def one(text: str, seed: int):
        g = parse(text, file="fuzz.npuir")
        verify(g)
        stats.notes["parsed and verified"] += 1
        return fuzzkit.run_graph(exe, g, np.random.default_rng(seed), stats)

    texts = st.one_of(
        st.tuples(st.integers(0, len(seeds) - 1), st.lists(_TOKEN_EDIT, min_size=1, max_size=6))
        .map(lambda t: token_mutate(seeds[t[0]], t[1], vocab)),
        st.tuples(st.integers(0, len(seeds) - 1), st.lists(_EDIT, min_size=1, max_size=6))
        .map(lambda t: apply_bytes(seeds[t[0]].encode(), t[1]).decode("utf-8", "replace")),
        st.tuples(st.sampled_from(["list", "region", "type", "parens", "range"]),
                  st.sampled_from([1000, 3000, 10_000, 30_000, 100_000])).map(lambda t: deep(*t)),
    )

    @fuzzkit.seeded
    @fuzzkit.hyp_settings(n)
    @given(texts, st.integers(0, 2**32 - 1))
    def case(text, seed):
        stats.case(one, text, seed)

    case()


@pytest.mark.fuzz
def test_fuzz_npuir_text():
    fuzzkit.record(fuzzkit.run_target("test_fuzz_npuir"))


# ---------------------------------------------------------------- what it found (fixed)

@pytest.mark.parametrize("kind", ["list", "region", "type", "parens", "range"])
@pytest.mark.parametrize("depth", [1000, 100_000])
def test_deep_nesting_is_a_parse_error(kind, depth):
    """A text nested 10^3..10^5 deep was a RecursionError (lists, regions); now a ParseError
    naming the line, raised before the whole text is even tokenized."""
    from npurun.errors import ParseError
    from npurun.ir import parse
    with pytest.raises(ParseError) as e:
        parse(deep(kind, depth), file="deep.npuir")
    assert str(e.value).startswith("deep.npuir:"), str(e.value)
    if kind in ("list", "region"):
        assert "nested deeper than 100 levels" in str(e.value)


def test_nesting_within_the_limit_still_parses():
    from npurun.ir import parse
    g = parse(deep("list", 1).replace("[1] f32 DRAM0 = [1]", "[1, 1, 1] f32 DRAM0 = [[[1]]]"))
    assert g.values["c"].data.shape == (1, 1, 1)


def test_an_attribute_of_the_wrong_type_is_a_verify_error():
    """Found by CI's 500-case run: perm=["a", 1] (a token swap) reached transpose's shape
    rule, which compared str with int (TypeError). Any rule's failure on its attributes is now
    a VerifyError naming the node."""
    from npurun.errors import VerifyError
    from npurun.ir import parse, verify
    g = parse('npuir 1\ngraph t\ninput x: [2, 3] f32\nop transpose @t (x: [2, 3] f32 -> y: [3, 2] f32) perm=["a", 1]\noutput y\n')
    with pytest.raises(VerifyError, match=r"node 't' \(transpose\).*perm.*TypeError"):
        verify(g)


@pytest.mark.parametrize("where", ["attr", "name", "weights"])
def test_a_string_with_a_raw_control_character_is_a_parse_error(where):
    """Found by the 100,000-case atheris run: a quoted string holding a raw control character
    passed the tokenizer and failed in json.loads (JSONDecodeError) — in an attribute, a
    quoted name or the weights file alike."""
    from npurun.errors import ParseError
    from npurun.ir import parse
    from npurun.ir.text import weights_file_of
    bad = '"a\x01b"'
    text = {"attr": f'npuir 1\ngraph t\ninput x: [2] f32\nop relu @r (x: [2] f32 -> y: [2] f32) tag={bad}\noutput y\n',
            "name": f'npuir 1\ngraph t\ninput {bad}: [2] f32\noutput {bad}\n',
            "weights": f'npuir 1\ngraph t weights={bad}\ninput x: [2] f32\noutput x\n'}[where]
    assert weights_file_of(text) is None
    with pytest.raises(ParseError, match=r"bad string .*Invalid control character"):
        parse(text, file="f.npuir")


def test_a_graph_output_with_an_empty_name_is_a_verify_error(tmp_path):
    """Found by the 100,000-case atheris onnx run: a node with no outputs and a graph output
    named "" (ONNX's name for an omitted optional operand) gave KeyError '' after the run."""
    import onnx
    from onnx import TensorProto, helper
    import npurun
    from npurun.errors import VerifyError
    vi = lambda nm: helper.make_tensor_value_info(nm, TensorProto.FLOAT, [3, 4])  # noqa: E731
    m = helper.make_model(helper.make_graph([helper.make_node("Hardmax", ["x"], [""])], "g", [vi("x")], [vi("")]),
                          opset_imports=[helper.make_opsetid("", 13)])
    onnx.save(m, tmp_path / "m.onnx")
    with pytest.raises(VerifyError, match="a graph output has an empty name"):
        npurun.load(tmp_path / "m.onnx")
