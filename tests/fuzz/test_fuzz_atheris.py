"""Coverage-guided fuzz targets (atheris, libFuzzer for Python): where the hypothesis targets
mutate by rules written here, libFuzzer keeps whichever mutated input reached new lines of
npurun's parsers and importer and mutates that further, so it walks into branches nobody
wrote a rule for. Two targets, the same pass rule as every other (fuzzkit.py):

- `.npuir` bytes -> parse -> verify (seeds: the pass tests' graphs and printed models);
- ONNX bytes -> import -> run on the reference backend (seeds: ESPCN, the hand-made models,
  a sample of the ONNX node suite).

atheris installs on Linux x86-64 for Python < 3.14 (pyproject's test extra); elsewhere these
targets fail with the reason instead of passing unrun."""
from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest

import fuzz_seeds
import fuzzkit


def fuzz_npuir(n: int, stats: fuzzkit.Stats) -> None:
    import atheris
    with atheris.instrument_imports(include=["npurun"]):
        from npurun.ir import parse, verify
    seeds = [t.encode() for t in fuzz_seeds.npuir_seeds()]

    def one(data: bytes):
        g = parse(data.decode("utf-8", "replace"), file="fuzz.npuir")
        verify(g)
        stats.notes["parsed and verified"] += 1
        return g

    fuzzkit.atheris_fuzz(n, stats, seeds, one)


def fuzz_onnx(n: int, stats: fuzzkit.Stats) -> None:
    import atheris
    with atheris.instrument_imports(include=["npurun"]):
        import npurun
        from npurun.frontend.onnx import import_model
    seeds = fuzz_seeds.onnx_seeds()
    exe = npurun.Executor("reference", parallelism=1)
    path = Path(tempfile.mkdtemp(prefix="npurun-atheris-onnx-")) / "model.onnx"
    rng = np.random.default_rng(0)

    def one(data: bytes):
        path.write_bytes(data)
        g = import_model(path)
        stats.notes["imported"] += 1
        return fuzzkit.run_graph(exe, g, rng, stats)

    fuzzkit.atheris_fuzz(n, stats, seeds, one)


@pytest.mark.fuzz
@pytest.mark.parametrize("target", ["npuir", "onnx"])
def test_fuzz_coverage_guided(target):
    assert fuzzkit.atheris_available(), ("atheris is not installed (pyproject's test extra installs it on "
                                         "Linux x86-64, Python < 3.14): the coverage-guided targets cannot run")
    fuzzkit.record(fuzzkit.run_target(f"test_fuzz_atheris:fuzz_{target}"))
