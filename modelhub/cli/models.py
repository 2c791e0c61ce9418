"""Model management commands: create, show, list/ls, verify, cp, rm."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click
from rich.progress import TaskID

from modelhub.cli import render
from modelhub.cli.create_files import hash_files, load_modelfile
from modelhub.cli.create_request import CreatePlan, plan_create
from modelhub.cli.progress import ProgressDisplay
from modelhub.client import Client, ensure_server
from modelhub.config import Settings
from modelhub.errors import (
    DamagedModelError,
    InputError,
    ModelfileError,
    ModelhubError,
    NotFoundError,
)

SHOW_FIELDS = ("license", "modelfile", "parameters", "system", "template")
_MISSING_FIELD = {
    "license": "No license was specified for this model.",
    "parameters": "No parameters were specified for this model.",
    "system": "No system message was specified for this model.",
    "template": "No prompt template was specified for this model.",
    "modelfile": "No Modelfile was returned for this model.",
}


def connect() -> Client:
    """A client for the configured daemon, started in the background if need be."""
    settings = Settings.from_env()
    client = Client(settings.base_url)
    ensure_server(client, settings)
    return client


def _echo_raw(text: str) -> None:
    click.echo(text, nl=not text.endswith("\n"))


# -- create --------------------------------------------------------------------------------------


@click.command("create")
@click.argument("model")
@click.option(
    "-f",
    "--file",
    "modelfile",
    metavar="FILE",
    help="Modelfile to build from (default: ./Modelfile).",
)
@click.option(
    "-q", "--quantize", metavar="TYPE", help="Quantize the model: q4_K_M, q4_K_S, q8_0, f16..."
)
@click.option("--draft-quantize", metavar="TYPE", help="Quantize the DRAFT model file.")
def create(
    model: str, modelfile: str | None, quantize: str | None, draft_quantize: str | None
) -> None:
    """Create MODEL from a Modelfile.

    Local files named by FROM, ADAPTER and DRAFT are hashed and uploaded (only those the
    daemon lacks), then the daemon's progress is shown, ending with `success`.
    """
    source = load_modelfile(modelfile, Path.cwd())
    try:
        plan = plan_create(
            model,
            source.text,
            source.base_dir,
            quantize=quantize,
            draft_quantize=draft_quantize,
        )
    except ModelfileError as exc:
        raise InputError(f"{source.label} {exc.message}") from None
    client = connect()
    with ProgressDisplay() as display:
        for warning in plan.warnings:
            display.warning(warning)
        digests = _hash_and_upload(client, plan, display)
        for item in client.create(plan.request(digests)):
            display.stream_item(item)


def _hash_and_upload(client: Client, plan: CreatePlan, display: ProgressDisplay) -> dict[Path, str]:
    paths = plan.local_files()
    if not paths:
        return {}
    task = display.start_task("gathering model components")
    digests = hash_files(paths)
    display.finish_task(task, suffix="")
    uploaded: set[str] = set()
    for path in paths:
        digest = digests[path]
        if digest in uploaded:
            continue
        uploaded.add(digest)
        if client.blob_exists(digest):
            continue
        size = path.stat().st_size
        # Short digest while running (fits 80 columns), the full one in the closing line.
        bar = display.start_task(
            f"copying file {digest[:19]}", size, final=f"copying file {digest}"
        )

        def advance(sent: int, total: int, bar: TaskID = bar) -> None:
            display.advance_to(bar, sent, total)

        client.push_blob(digest, path, advance)
        display.finish_task(bar)
    return digests


# -- show ----------------------------------------------------------------------------------------


@click.command("show")
@click.argument("model")
@click.option("--license", "fields", flag_value="license", multiple=True, help="Show the license.")
@click.option(
    "--modelfile", "fields", flag_value="modelfile", multiple=True, help="Show the Modelfile."
)
@click.option(
    "--parameters", "fields", flag_value="parameters", multiple=True, help="Show parameters."
)
@click.option(
    "--system", "fields", flag_value="system", multiple=True, help="Show the system message."
)
@click.option(
    "--template", "fields", flag_value="template", multiple=True, help="Show the template."
)
@click.option("-v", "--verbose", is_flag=True, help="Also show metadata and tensors.")
def show(model: str, fields: tuple[str, ...], verbose: bool) -> None:
    """Show information about MODEL."""
    chosen = set(fields)
    if len(chosen) > 1:
        names = ", ".join(f"--{name}" for name in SHOW_FIELDS)
        raise InputError(f"only one of {names} can be given")
    info = connect().show(model, verbose=verbose)
    if chosen:
        field = chosen.pop()
        value = info.get(field)
        _echo_raw(str(value) if value else _MISSING_FIELD[field])
        return
    click.echo(render.show_summary(info, verbose=verbose))


# -- list ----------------------------------------------------------------------------------------


@click.command("list")
@click.argument("prefix", required=False)
@click.option("--catalog", is_flag=True, help="List the catalog of pullable names instead.")
def list_models(prefix: str | None, catalog: bool) -> None:
    """List models (optionally only those whose name starts with PREFIX). Alias: ls."""
    if catalog:
        rows = connect().request_json("GET", "/api/catalog")["models"]
        if prefix:
            rows = [r for r in rows if str(r["name"]).lower().startswith(prefix.lower())]
        _echo_raw(render.catalog_table(rows))
        return
    models: list[Any] = connect().list()  # damaged ones too, with their state
    if prefix:
        models = render.filter_by_prefix(models, prefix)
    _echo_raw(render.list_table(models, datetime.now(UTC)))


# -- verify --------------------------------------------------------------------------------------


@click.command("verify")
@click.argument("model", required=False)
def verify(model: str | None) -> None:
    """Re-hash the files of MODEL (every model without one) and say which are damaged.

    A file whose content does not match its digest is removed from the store; pull or create
    the model again to restore it. Exits with status 1 when a model is damaged.
    """
    answer = connect().request_json("POST", "/api/verify", {"model": model} if model else {})
    reports = [r for r in (answer or {}).get("models") or [] if isinstance(r, dict)]
    for line in verify_report(reports):
        click.echo(line)
    bad = sum(1 for r in reports if r.get("state") != "ok")
    if bad:
        raise DamagedModelError(f"{bad} of {len(reports)} models damaged")


def verify_report(reports: list[dict[str, Any]]) -> list[str]:
    """The lines `verify` prints: one per model, its problems and the repair below it."""
    if not reports:
        return ["no models"]
    lines = []
    for report in reports:
        lines.append(f"{report.get('name')}: {report.get('state')}")
        lines.extend(f"  {problem}" for problem in report.get("problems") or [])
        if report.get("repair"):
            lines.append(f"  to repair: {report['repair']}")
    return lines


# -- cp / rm -------------------------------------------------------------------------------------


@click.command("cp")
@click.argument("source")
@click.argument("destination")
def copy(source: str, destination: str) -> None:
    """Copy SOURCE to DESTINATION (blobs are shared, not duplicated)."""
    connect().copy(source, destination)
    click.echo(f"copied '{source}' to '{destination}'")


@click.command("rm")
@click.argument("models", nargs=-1, required=True)
def remove(models: tuple[str, ...]) -> None:
    """Remove one or more models (each is unloaded first if it is running)."""
    client = connect()
    for model in models:
        _unload(client, model)
        client.delete(model)
        click.echo(f"deleted '{model}'")


def _unload(client: Client, model: str) -> None:
    """Ask the daemon to unload ``model``; a model that is not loaded is not an error."""
    try:
        for _ in client.stream("POST", "/api/generate", {"model": model, "keep_alive": 0}):
            pass
    except NotFoundError:
        pass  # nothing loaded under that name: nothing to stop
    except ModelhubError:
        click.echo(f"Warning: unable to stop model '{model}'", err=True)
