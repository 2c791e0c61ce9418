"""Turn a Modelfile into a ``POST /api/create`` request and the local files it needs uploaded.

Nothing here talks to the daemon: ``plan_create`` maps the parsed Modelfile onto request
fields and the local files behind FROM / ADAPTER / DRAFT (found through
``modelhub.cli.create_files``). The CLI then hashes those files, uploads the blobs the daemon
lacks and sends ``CreatePlan.request(digests)``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from modelhub.cli.create_files import (
    LocalRef,
    expand_path,
    files_of,
    local_ref,
    path_exists,
    relative_names,
)
from modelhub.errors import InputError, InvalidNameError, ModelfileError
from modelhub.modelfile import Command, parameters_from_commands, parse_modelfile
from modelhub.modelfile.fields import add_text_fields
from modelhub.store.names import parse_name

DRAFT_KEYWORDS = frozenset({"auto", "none", "mtp", "ngram"})


@dataclass
class CreatePlan:
    """What ``create`` will send: request fields plus the local files behind ``files``,
    ``adapters`` and ``draft_files`` (request name -> path)."""

    model: str
    fields: dict[str, Any] = field(default_factory=dict)
    files: dict[str, Path] = field(default_factory=dict)
    adapters: dict[str, Path] = field(default_factory=dict)
    draft_files: dict[str, Path] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    def local_files(self) -> list[Path]:
        """Every file to hash and upload, each once, in request order."""
        seen: dict[Path, None] = {}
        for group in (self.files, self.adapters, self.draft_files):
            for path in group.values():
                seen.setdefault(path, None)
        return list(seen)

    def request(self, digests: Mapping[Path, str]) -> dict[str, Any]:
        """The ``/api/create`` body, given the ``sha256:<hex>`` digest of each local file."""
        body: dict[str, Any] = {"model": self.model, **self.fields}
        for key, group in (
            ("files", self.files),
            ("adapters", self.adapters),
            ("draft_files", self.draft_files),
        ):
            if group:
                body[key] = {name: digests[path] for name, path in group.items()}
        return body


# -- building the plan ---------------------------------------------------------------------------


def plan_create(
    model: str,
    source: str | bytes,
    base_dir: Path,
    *,
    quantize: str | None = None,
    draft_quantize: str | None = None,
) -> CreatePlan:
    """Parse a Modelfile and build the create plan (see ``plan_from_commands``)."""
    return plan_from_commands(
        model, parse_modelfile(source), base_dir, quantize=quantize, draft_quantize=draft_quantize
    )


def plan_from_commands(
    model: str,
    commands: Sequence[Command],
    base_dir: Path,
    *,
    quantize: str | None = None,
    draft_quantize: str | None = None,
) -> CreatePlan:
    """Map parsed Modelfile commands onto a create request (§4.5 of the compatibility notes,
    plus DRAFT's model-name and ``mtp``/``ngram`` forms). Raises ``ModelfileError`` with the
    line of the offending instruction."""
    parse_name(model)  # validated here; the daemon stores the name as sent
    plan = CreatePlan(model=model.strip())

    from_refs, draft_refs, adapter_ref = _resolve_local(commands, base_dir)
    adapter_refs = [adapter_ref] if adapter_ref is not None else []
    named = {
        "FROM": _named_files(from_refs),
        "DRAFT": _named_files(draft_refs),
        "ADAPTER": _named_files(adapter_refs),
    }

    def files_for(keyword: str, refs: list[LocalRef]) -> dict[str, Path]:
        others = set().union(*(files for kind, files in named.items() if kind != keyword))
        return relative_names(_dedupe(f for r in refs for f in files_of(r, others, keyword)))

    plan.files = files_for("FROM", from_refs)
    plan.draft_files = files_for("DRAFT", draft_refs)
    plan.adapters = files_for("ADAPTER", adapter_refs)
    if len(plan.draft_files) > 1:
        # The daemon pairs exactly one draft model with the target.
        line = draft_refs[-1].command.line
        names = ", ".join(sorted(plan.draft_files))
        raise ModelfileError(
            f"DRAFT resolves to {len(plan.draft_files)} GGUF files ({names}); "
            "name the one draft model file",
            line,
        )

    fields = plan.fields
    from_name = _from_name(commands, base_dir)
    if from_name is not None:
        fields["from"] = from_name
    draft_word = _draft_reference(commands, base_dir, has_files=bool(plan.draft_files))
    if draft_word is not None:
        fields["draft"] = draft_word
    add_text_fields(commands, fields)

    parameters, warnings = parameters_from_commands(list(commands))
    plan.warnings.extend(warnings)
    if parameters:
        fields["parameters"] = parameters
    if quantize:
        fields["quantize"] = quantize
    if draft_quantize:
        if draft_word is not None:
            raise InputError(
                f"--draft-quantize requires a DRAFT model file to quantize; DRAFT {draft_word} "
                "is not a file"
            )
        if not plan.draft_files:
            raise InputError("--draft-quantize requires a DRAFT model")
        fields["draft_quantize"] = draft_quantize
    return plan


def _named_files(refs: Sequence[LocalRef]) -> set[Path]:
    """Canonical paths of the references that name a file (not a directory)."""
    return {r.canonical for r in refs if not r.path.is_dir()}


def _dedupe(paths: Iterable[Path]) -> list[Path]:
    return list(dict.fromkeys(paths))


def _resolve_local(
    commands: Sequence[Command], base_dir: Path
) -> tuple[list[LocalRef], list[LocalRef], LocalRef | None]:
    """Local FROM and DRAFT references in order, the last ADAPTER; checks that no DRAFT
    names the same path as a FROM (either order)."""
    from_refs: list[LocalRef] = []
    draft_refs: list[LocalRef] = []
    adapter: LocalRef | None = None
    for command in commands:
        if command.name not in ("model", "draft", "adapter"):
            continue
        ref = local_ref(command, base_dir)
        if command.name == "adapter":
            if ref is None:
                path = expand_path(command.args, base_dir)
                raise ModelfileError(f"ADAPTER {command.args}: no such file: {path}", command.line)
            adapter = ref  # last ADAPTER wins, as in Ollama
            continue
        if ref is None:
            continue
        others = draft_refs if command.name == "model" else from_refs
        if any(other.canonical == ref.canonical for other in others):
            raise ModelfileError(
                f"DRAFT must not reference the same local path as FROM: {ref.canonical}",
                command.line,
            )
        (from_refs if command.name == "model" else draft_refs).append(ref)
    return from_refs, draft_refs, adapter


def _from_name(commands: Sequence[Command], base_dir: Path) -> str | None:
    """The last FROM that names a model rather than a local path, validated."""
    name = None
    for command in commands:
        if command.name != "model" or path_exists(expand_path(command.args, base_dir), command):
            continue
        name = _checked_name("FROM", command, base_dir)
    return name


def _draft_reference(commands: Sequence[Command], base_dir: Path, *, has_files: bool) -> str | None:
    """``auto``, ``none``, ``mtp``, ``ngram`` or a model name from DRAFT lines that are not
    local paths.

    A Modelfile drafts from one kind of source: files (several merge), or one keyword or name.
    """
    chosen: Command | None = None
    value: str | None = None
    for command in commands:
        if command.name != "draft" or path_exists(expand_path(command.args, base_dir), command):
            continue
        word = command.args.strip()
        this = word.lower() if word.lower() in DRAFT_KEYWORDS else None
        if this is None:
            this = _checked_name("DRAFT", command, base_dir)
        if has_files or (value is not None and value != this):
            earlier = "a DRAFT file" if has_files else f"DRAFT {chosen.args if chosen else value}"
            raise ModelfileError(
                f"DRAFT {word}: conflicts with {earlier}; a Modelfile drafts from files, "
                "`auto`, `none`, `mtp`, `ngram` or one model name, not a mix",
                command.line,
            )
        chosen, value = command, this
    return value


def _checked_name(keyword: str, command: Command, base_dir: Path) -> str:
    """``command.args`` as a model name, verbatim; a clear error when it is neither a file
    nor a valid name."""
    raw = command.args.strip()
    path = expand_path(command.args, base_dir)
    if raw.lower().endswith((".gguf", ".safetensors", ".bin")):
        raise ModelfileError(f"{keyword} {raw}: no such file: {path}", command.line)
    try:
        parse_name(raw)
    except InvalidNameError as exc:
        raise ModelfileError(
            f"{keyword} {raw}: no such file, and not a model name "
            f"(no file at {path}; {exc.message})",
            command.line,
        ) from exc
    return raw
