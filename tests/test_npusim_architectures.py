"""The calibration architectures reproduce the MAC counts published for them: AI Hub's where
its table lists one, else the reference count of npurun/backends/npusim/data/reference_macs.csv
(each row says where it comes from). The tables ship inside the repository; a missing one is
a failure, never a skipped check."""
import csv

import pytest

from npurun.backends.npusim.data import AIHUB, REFERENCE_MACS, data_path
from npurun.errors import NpurunError
from npurun.ir import verify
from npurun.ir.cost import node_costs
from npurun.zoo.architectures import ARCHITECTURES, CALIBRATION, build


def _published() -> dict[str, tuple[float, str]]:
    out = {}
    with data_path(AIHUB).open() as f:
        for r in csv.DictReader(f):
            arch = CALIBRATION.get(r["model"].removesuffix("_quantized"))
            if r["macs_g"] and arch:
                out[arch] = (float(r["macs_g"]), "AI Hub")
    with data_path(REFERENCE_MACS).open() as f:
        for r in csv.DictReader(f):
            out.setdefault(r["architecture"], (float(r["macs_g"]), r["source"]))
    return out


PUBLISHED = _published()
# SESR-M5 as AI Hub exports it (expanded blocks) has no published count anywhere: its builder
# follows the paper's layer list (docs/npusim.md). Every other architecture has a row.
UNPUBLISHED_OK = {"sesr_m5"}


def test_data_is_inside_the_repository_and_missing_data_fails(tmp_path, monkeypatch):
    from npurun.backends.npusim import data
    assert data_path(AIHUB).is_file() and str(data.HERE).startswith(str(data.HERE.parents[3]))
    monkeypatch.setattr(data, "HERE", tmp_path)
    with pytest.raises(NpurunError, match="aihub_x_elite.csv"):
        data.data_path(AIHUB)


@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
def test_architecture_verifies_and_matches_published_macs(arch):
    g = verify(build(arch))
    macs = sum(c.macs for c in node_costs(g, {i: g.values[i].shape for i in g.inputs}))
    assert macs > 0
    if arch not in PUBLISHED:
        assert arch in UNPUBLISHED_OK, f"{arch}: no published or reference MAC count to check against"
        return
    want, source = PUBLISHED[arch]
    assert macs / 1e9 == pytest.approx(want, rel=0.015), source


def test_detr_backbone_keeps_its_frozen_batchnorm_as_the_export_writes_it():
    """transformers' DETR replaces each BatchNorm of its ResNet by DetrFrozenBatchNorm2d
    (x * scale + shift), which the exporter writes as Mul and Add after the conv, not as a
    BatchNormalization a converter folds: npusim times those as vector ops (the 2026-12-05
    analysis in docs/npusim.md), and so must the graph it sees."""
    from npurun.backends.npusim.view import npusim_view
    g = npusim_view(build("detr_resnet50"))
    readers = g.consumers()
    convs = [n for n in g.nodes if n.op == "conv"]
    after = [readers[n.outputs[0]][0].op for n in convs[:-1]]   # the last conv is DETR's projection
    assert len(convs) == 54 and after == ["mul"] * 53
    plain = npusim_view(build("resnet50"))
    assert not any(n.op == "mul" for n in plain.nodes)          # a classifier's BatchNorm is folded
