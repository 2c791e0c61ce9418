"""Drafters and verification for lossless speculative decoding."""
