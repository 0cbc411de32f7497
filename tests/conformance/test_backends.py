"""The ONNX node suite beyond the reference backend (issue K): every case with control flow
(If, Loop, Scan, SequenceMap) runs on the cpu and torch:cpu backends, whose programs compile
the regions themselves, and gives the expected outputs; and on every backend run here, no
case ends in an internal exception (AttributeError, IndexError, a NumPy ValueError...): a
case either passes or fails with an NpurunError that names what was wrong."""
import pytest

from .runner import all_cases, run_case
from .test_node_suite import excluded

CONTROL_FLOW = {"If", "Loop", "Scan", "SequenceMap"}
BACKENDS = ["cpu", "torch:cpu", "reference"]


def _has_control_flow(graph) -> bool:
    for n in graph.node:
        if n.op_type in CONTROL_FLOW:
            return True
        for a in n.attribute:
            if (a.HasField("g") and _has_control_flow(a.g)) or any(_has_control_flow(s) for s in a.graphs):
                return True
    return False


@pytest.fixture(scope="module")
def cases():
    return list(all_cases())


@pytest.mark.parametrize("device", ["cpu", "torch:cpu"])
def test_control_flow_cases_run_on_the_backends_that_compile_regions(cases, device):
    ex = excluded()
    flow = [c for c in cases if c.name not in ex and _has_control_flow(c.model.graph)]
    assert len(flow) >= 40  # (44 with onnx 1.23)
    failed = {c.name: p for c in flow if (p := run_case(c, device))}
    assert not failed, "\n".join(f"{k}: {v}" for k, v in sorted(failed.items()))


@pytest.mark.parametrize("device", BACKENDS)
def test_no_case_ends_in_an_internal_exception(cases, device):
    crashes = {c.name: p for c in cases if (p := run_case(c, device)) and p.startswith("crash")}
    assert not crashes, "\n".join(f"{k}: {v}" for k, v in sorted(crashes.items()))
