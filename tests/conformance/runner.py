"""Run the ONNX backend node test suite through an npurun backend.

With onnx >= 1.16 the node cases are built in memory (`onnx.backend.test.case.node`); older
releases shipped them on disk as `model.onnx` + `test_data_set_0/{input,output}_*.pb`, which
`disk_cases` reads. Outputs are compared like the suite does: rtol/atol from the case
(1e-3 / 1e-7 unless it says otherwise), dtypes equal, NaNs in the same places. A case whose
expected values are one random generator's stream (NOT_COMPARABLE) is compared in dtypes and
shapes only and reported as failing, "not comparable", with why.

    python tests/conformance/runner.py [--device reference] [--filter SUBSTRING] [--failures]
"""
from __future__ import annotations

import argparse
import glob
import os
import sys
import warnings
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import numpy_helper


@dataclass
class Case:
    name: str
    model: onnx.ModelProto
    data_sets: list  # [(inputs: list, outputs: list)]
    rtol: float = 1e-3
    atol: float = 1e-7


def memory_cases() -> list[Case]:
    from onnx.backend.test.case.node import collect_testcases
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        return [Case(c.name, c.model, c.data_sets, c.rtol, c.atol) for c in collect_testcases(None)]


def disk_cases(root: str) -> list[Case]:
    """Cases in the on-disk layout of onnx < 1.16: NAME/model.onnx, NAME/test_data_set_*/."""
    out = []
    for model_path in sorted(glob.glob(os.path.join(root, "*", "model.onnx"))):
        d = os.path.dirname(model_path)
        sets = []
        for ds in sorted(glob.glob(os.path.join(d, "test_data_set_*"))):
            read = lambda kind: [numpy_helper.to_array(onnx.load_tensor(p))  # noqa: E731
                                 for p in sorted(glob.glob(os.path.join(ds, f"{kind}_*.pb")))]
            sets.append((read("input"), read("output")))
        out.append(Case(os.path.basename(d), onnx.load(model_path), sets))
    return out


def all_cases() -> list[Case]:
    try:
        return memory_cases()
    except ImportError:  # an old onnx: its cases are files in the wheel
        from onnx.backend.test import __file__ as base
        return disk_cases(os.path.join(os.path.dirname(base), "data", "node"))


def _arrays(values: list) -> list:
    out = []
    for a in values:
        if isinstance(a, onnx.TensorProto):
            a = numpy_helper.to_array(a)
        elif isinstance(a, np.generic):
            a = np.asarray(a)
        out.append(a)
    return out


# Cases whose expected values are one particular generator's random stream, which no other
# generator (npurun's included) reproduces: ONNX leaves the generator to the implementation.
# Their dtypes and shapes are compared; they still count as failing, with this reason.
# (tests/test_ops_random.py checks npurun's draws statistically.)
_UNSEEDED = ("expected values are unseeded draws of NumPy's global generator "
             "(np.random.binomial in onnx's test generator); not reproducible")
_MT19937 = ("expected mask is NumPy's legacy MT19937 stream after np.random.seed(0) in onnx's test "
            "generator; npurun draws from PCG64")
NOT_COMPARABLE = {
    **{f"test_bernoulli{s}": _UNSEEDED for s in ("", "_expanded", "_double", "_double_expanded",
                                                 "_seed", "_seed_expanded")},
    **{f"test_training_dropout{s}": _MT19937 for s in ("", "_mask", "_default", "_default_mask")},
}


def compare(got, expected, case) -> str | None:
    """None when `got` matches `expected` (a tensor, a list of them, or None)."""
    if expected is None or got is None:
        return None if got is expected else f"got {type(got).__name__}, expected {type(expected).__name__}"
    if isinstance(expected, list):
        if not isinstance(got, list) or len(got) != len(expected):
            return f"got {type(got).__name__}, expected a sequence of {len(expected)}"
        return next((p for p in (compare(g, e, case) for g, e in zip(got, expected)) if p), None)
    got, expected = np.asarray(got), np.asarray(expected)
    if got.dtype != expected.dtype:
        return f"dtype {got.dtype}, expected {expected.dtype}"
    if got.shape != expected.shape:
        return f"shape {got.shape}, expected {expected.shape}"
    if case.name in NOT_COMPARABLE:
        return None
    if expected.dtype.kind in "fc" or expected.dtype.name in ("bfloat16",) or expected.dtype.name.startswith("float8"):
        # ml_dtypes floats (kind "V") are compared as floats too, in float32.
        np.testing.assert_allclose(got.astype(np.float32) if got.dtype.kind == "V" else got,
                                   expected.astype(np.float32) if expected.dtype.kind == "V" else expected,
                                   rtol=case.rtol, atol=case.atol)
    else:
        np.testing.assert_array_equal(got, expected)
    return None


def run_case(case: Case, device: str = "reference") -> str | None:
    """None when npurun matches the expected outputs, else a one-line reason."""
    import npurun
    from npurun.frontend.onnx import import_model
    try:
        with np.errstate(all="ignore"):
            graph = import_model(case.model)
            exe = npurun.Executor(device, parallelism=1)
            init = {i.name for i in case.model.graph.initializer}
            in_names = [i.name for i in case.model.graph.input if i.name not in init]
            for inputs, expected in case.data_sets:
                # NumPy scalars are 0-d tensors, TensorProtos are tensors still to decode;
                # lists, dicts and None are sequences, maps, optionals.
                inputs, expected = _arrays(inputs), _arrays(expected)
                if any(isinstance(a, dict) for a in list(inputs) + list(expected)):
                    return "maps are not supported"
                outs = exe.run_sync(graph, dict(zip(in_names, inputs)))
                got = [outs[n] for n in graph.outputs]
                if len(got) != len(expected):
                    return f"{len(got)} outputs, expected {len(expected)}"
                for g, e in zip(got, expected):
                    problem = compare(g, e, case)
                    if problem:
                        return problem
        if case.name in NOT_COMPARABLE:
            return f"not comparable (dtypes and shapes match): {NOT_COMPARABLE[case.name]}"
    except AssertionError as e:
        return "wrong values: " + " ".join(str(e).split())[:200]
    except npurun.NpurunError as e:
        return str(e).splitlines()[0][:300]
    except Exception as e:  # a crash is a failure of its own kind, reported with its type
        return f"crash: {e.__class__.__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
    return None


def run_all(device="reference", name_filter=None):
    results = {}
    for c in all_cases():
        if name_filter and name_filter not in c.name:
            continue
        results[c.name] = run_case(c, device)
    return results


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="reference")
    ap.add_argument("--filter")
    ap.add_argument("--failures", action="store_true", help="list each failing case and why")
    args = ap.parse_args()
    res = run_all(args.device, args.filter)
    failed = {k: v for k, v in res.items() if v}
    if args.failures:
        for k, v in sorted(failed.items()):
            print(f"{k}: {v}")
    n_pass = len(res) - len(failed)
    print(f"conformance: {n_pass} passed, {len(failed)} failed ({100 * n_pass / max(1, len(res)):.1f}% of {len(res)} node cases)")


if __name__ == "__main__":
    sys.exit(main())
