"""The published measurements npusim is calibrated on, shipped inside the package (source and
licence in README.md beside this file). Everything that reads them goes through `data_path`,
so no test or benchmark reads a path outside the repository."""
from __future__ import annotations

from pathlib import Path

from ....errors import NpurunError

HERE = Path(__file__).parent
AIHUB = "aihub_x_elite.csv"
AIHUB_LLM = "aihub_x_elite_llm.csv"
REFERENCE_MACS = "reference_macs.csv"


def data_path(name: str) -> Path:
    """The shipped file `name`; a missing one is an error naming it (never an empty table)."""
    p = HERE / name
    if not p.is_file():
        raise NpurunError(f"{p}: npusim data file missing (it ships with npurun; see {HERE / 'README.md'})")
    return p
