"""OpenMP's wait between operations, for processes that hold several engines (the test suite,
the benchmarks).

llama.cpp's CPU backend runs a decode's operations on an OpenMP team, and libgomp keeps a team
per thread that starts parallel work: each engine decodes on a batch thread of its own. Once a
process holds more OpenMP threads than cores (two engines on two cores, even one of them idle),
libgomp cuts its busy-wait from 300,000 spins to 100, so the threads sleep and wake around
every operation: SmolLM2 135M decoded at 68-71 tok/s beside one idle engine against 110-120
alone. A runner process decodes on one thread (embeddings too), so the daemon never sees this;
the suite and the benchmarks did. ``OMP_WAIT_POLICY=ACTIVE`` with ``GOMP_SPINCOUNT=300000``
keeps a lone engine's wait and 1,000 spins when over-subscribed: 114-117 tok/s beside idle
engines, whose threads still go to sleep (no CPU used while idle).
"""

from __future__ import annotations

import os


def steady_wait() -> None:
    """Set that wait for this process and its children, unless the environment sets its own.
    Call it before llama.cpp's libraries load: libgomp reads the variables once."""
    os.environ.setdefault("OMP_WAIT_POLICY", "ACTIVE")
    os.environ.setdefault("GOMP_SPINCOUNT", "300000")
