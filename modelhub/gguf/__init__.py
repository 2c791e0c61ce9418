"""GGUF files: the bounds-checked header reader, model facts, draft pairing, quantizing."""
