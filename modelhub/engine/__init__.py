"""The generation engine (runs inside the runner process).

llama.cpp's CPU backend is built with OpenMP here, and OpenMP threads spin at every barrier by
default: on a shared CPU (a desktop, a CI runner, several loaded models) a descheduled thread then
stalls the others (measured: 0.5 vs 14 tokens/s on a busy 2-core machine), while sleeping waits
cost little on an idle one. The policy is read once, when llama.cpp's library loads, so it is set
here, before any engine module imports ``llama_cpp``; a value the user set wins.
"""

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
