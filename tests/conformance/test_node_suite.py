"""The ONNX backend node test suite through npurun's reference backend.

Every case passes except those listed in `excluded.txt`, each with its reason; a listed case
that starts passing fails this test too, so the list only ever shrinks and stays true.
Regenerate the list after adding ops: `python tests/conformance/update_exclusions.py`.
"""
from pathlib import Path

import pytest

from .runner import run_all

EXCLUDED = Path(__file__).with_name("excluded.txt")


def excluded() -> dict[str, str]:
    out = {}
    for line in EXCLUDED.read_text().splitlines():
        name, _, reason = line.partition("#")
        if name.strip():
            out[name.strip()] = reason.strip()
    return out


@pytest.fixture(scope="module")
def results():
    return run_all("reference")


def test_node_suite(results):
    ex = excluded()
    failed = {k: v for k, v in results.items() if v}
    n_pass = len(results) - len(failed)
    from conftest import SUMMARY
    SUMMARY.append(f"conformance (ONNX node suite, reference backend): {n_pass} passed, "
                   f"{len(failed)} failed, {100 * n_pass / len(results):.1f}% of {len(results)} cases")
    unexpected = {k: v for k, v in failed.items() if k not in ex}
    fixed = sorted(k for k in ex if k in results and not results[k])
    assert not unexpected, "cases that should pass fail:\n" + "\n".join(f"{k}: {v}" for k, v in sorted(unexpected.items()))
    assert not fixed, "cases listed in excluded.txt now pass; remove them: " + ", ".join(fixed)
    unknown = sorted(k for k in ex if k not in results)
    assert not unknown, "excluded.txt names cases the suite does not have: " + ", ".join(unknown)


def test_every_imported_case_round_trips_through_npuir(tmp_path):
    """print -> parse gives an equal graph, and printing it again gives the same text, for every
    node-suite model npurun imports (control-flow regions, sequences and all element types)."""
    import warnings

    from npurun.errors import NpurunError
    from npurun.frontend.onnx import import_model
    from npurun.ir import print_graph, save, verify
    from npurun.ir.io import load_npuir

    from .runner import all_cases
    checked = 0
    for i, case in enumerate(all_cases()):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                g = import_model(case.model)
        except NpurunError:
            continue
        path = save(g, tmp_path / f"m{i}.npuir")
        g2 = load_npuir(path)
        g2.source = g.source
        assert g2 == g, case.name
        assert print_graph(g2) == print_graph(g), case.name
        verify(g2)
        checked += 1
    print(f"\nround trip: {checked} imported node-suite models")
    assert checked > 500
