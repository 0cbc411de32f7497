"""The cpu backend keeps freed pages for the next run (native.keep_freed_pages): a model whose
outputs are megabytes faults its pages in once, not every run. Counted in a child process (the
page faults of this one include every other test's threads), never timed."""
import json
import os
import subprocess
import sys

import pytest

CHILD = r"""
import json, resource, sys
import numpy as np
import npurun
from npurun.ir import parse
g = parse('''npuir 1
graph big
input x: [1, 64, 256, 256] f32 DRAM0
op add @a (x: [1, 64, 256, 256] f32 DRAM0, x: [1, 64, 256, 256] f32 DRAM0 -> a: [1, 64, 256, 256] f32 DRAM0)
op mul @m (a: [1, 64, 256, 256] f32 DRAM0, x: [1, 64, 256, 256] f32 DRAM0 -> b: [1, 64, 256, 256] f32 DRAM0)
op sub @s (b: [1, 64, 256, 256] f32 DRAM0, a: [1, 64, 256, 256] f32 DRAM0 -> c: [1, 64, 256, 256] f32 DRAM0)
op add @t (c: [1, 64, 256, 256] f32 DRAM0, b: [1, 64, 256, 256] f32 DRAM0 -> y: [1, 64, 256, 256] f32 DRAM0)
output y: [1, 64, 256, 256] f32 DRAM0
''')
exe = npurun.Executor("cpu", parallelism=1)
x = np.random.default_rng(0).standard_normal((1, 64, 256, 256)).astype(np.float32)
for _ in range(3):
    exe.run_sync(g, {"x": x})
f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    exe.run_sync(g, {"x": x})
print(json.dumps((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0) / 5))
"""


def _faults(env_extra: dict) -> float:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "NPURUN_MALLOC"))}
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=300,
                         env={**env, **env_extra})
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc's tunables")
def test_freed_pages_are_kept_for_the_next_run():
    kept, given_back = _faults({}), _faults({"NPURUN_MALLOC_TUNE": "0"})
    # 16 MB outputs, three of them freed together at the end of a run (48 MB at the heap's top:
    # glibc's own trim threshold after 16 MB blocks is 32 MB) are faulted in again when given back
    assert given_back > 400, given_back  # (1,000 a run measured)
    assert kept < 40, (kept, given_back)  # (0.2 a run measured)
