"""modelhub: a local model manager with lossless speculative decoding."""

__version__ = "0.1.0"
