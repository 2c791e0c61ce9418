"""The Modelfile: parsing (Ollama's grammar plus DRAFT), parameter typing and rendering back."""

from modelhub.modelfile.params import (
    DEPRECATED_PARAMETERS,
    PARAMETER_TYPES,
    check_parameter,
    coerce_option,
    normalize_requires,
    parameters_from_commands,
    parse_parameter,
)
from modelhub.modelfile.parser import KEYWORDS, MESSAGE_ROLES, Command, parse_modelfile
from modelhub.modelfile.render import RenderSpec, format_parameters, render_modelfile

__all__ = [
    "DEPRECATED_PARAMETERS",
    "KEYWORDS",
    "MESSAGE_ROLES",
    "PARAMETER_TYPES",
    "Command",
    "RenderSpec",
    "check_parameter",
    "coerce_option",
    "format_parameters",
    "normalize_requires",
    "parameters_from_commands",
    "parse_modelfile",
    "parse_parameter",
    "render_modelfile",
]
