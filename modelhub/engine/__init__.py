"""The generation engine (runs inside the runner process).

llama.cpp's CPU backend is built with OpenMP here. Its threads meet at a barrier after every
operation of a decode (hundreds per token), so how a waiting thread waits decides the speed:
with ``OMP_WAIT_POLICY=PASSIVE`` each barrier sleeps and wakes through the kernel, which cost
2.7x per token on an idle 2-core machine (21.5 vs 8.0 ms, SmolLM2 Q4_1), and was no faster
with one or both cores busy with other work, or with two decoders on two cores (measured
16-60 ms passive vs 16-18 ms with libgomp's default: spin a while, then sleep). A fixed short
spin (``GOMP_SPINCOUNT=10000``) was worst of all with two decoders (218 ms). So the engine
leaves libgomp's default, as llama-server and llama-cpp-python do; ``OMP_WAIT_POLICY`` or
``GOMP_SPINCOUNT`` set by the user still apply (they are read when llama.cpp's library loads).
"""
