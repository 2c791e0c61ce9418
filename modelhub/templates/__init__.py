"""Prompt templates: a Go text/template subset (Modelfile TEMPLATE) and sandboxed Jinja (GGUF)."""

from modelhub.templates.gotemplate import GoTemplate, Limits, parse_template
from modelhub.templates.jinja_chat import compile_chat_template, render_chat_template

__all__ = [
    "GoTemplate",
    "Limits",
    "compile_chat_template",
    "parse_template",
    "render_chat_template",
]
