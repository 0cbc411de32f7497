"""The calibration architectures reproduce the MAC counts AI Hub publishes for them."""
import csv
from pathlib import Path

import pytest

from npurun.ir import verify
from npurun.ir.cost import node_costs
from npurun.zoo.architectures import ARCHITECTURES, CALIBRATION, build

DATA = Path("/work/shared/data/aihub_x_elite.csv")


def _published():
    out = {}
    if DATA.exists():
        for r in csv.DictReader(DATA.open()):
            if r["macs_g"] and r["model"] in CALIBRATION:
                out[CALIBRATION[r["model"]]] = float(r["macs_g"])
    return out


PUBLISHED = _published()


@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
def test_architecture_verifies_and_matches_published_macs(arch):
    g = verify(build(arch))
    macs = sum(c.macs for c in node_costs(g, {i: g.values[i].shape for i in g.inputs}))
    assert macs > 0
    if arch in PUBLISHED:
        assert macs / 1e9 == pytest.approx(PUBLISHED[arch], rel=0.015)
