"""``modelhub launch AGENT``: point a coding agent at this daemon and a model, as ``ollama launch``.

Claude Code speaks Anthropic's Messages API (``/v1/messages``), Codex OpenAI's Responses API
and opencode Chat Completions (both under ``/v1``). Without ``--write`` the command only prints
what to set; with it, the agent's own config file gets the entries (other settings kept, the
old file copied to ``<file>.bak-<time>`` first). Nothing is installed and nothing is started.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import click

from modelhub.config import Settings
from modelhub.errors import InputError

PROVIDER = "modelhub"  # the provider / profile name written into the agents' configs


@dataclass(frozen=True)
class AgentSetup:
    """What one agent needs: environment, a config file and its merge, how to start it."""

    title: str
    model: str
    env: dict[str, str]
    path: Path
    snippet: str  # the entries, as they appear in the file
    merge: Callable[[str | None], str]  # the file's text (None: absent) -> the new text
    command: str


def daemon_url() -> str:
    """The daemon's address as a client reaches it (a wildcard bind is reached on loopback)."""
    url = Settings.from_env().base_url
    return re.sub(r"//(0\.0\.0\.0|\[::\])(?=:)", "//127.0.0.1", url)


def _home(variable: str, *default: str) -> Path:
    value = os.environ.get(variable)
    return Path(value) if value else Path.home().joinpath(*default)


def claude(url: str, model: str) -> AgentSetup:
    """Claude Code: the Anthropic variables, every model tier on ``model`` (its background
    and subagent calls would otherwise ask for Claude models this daemon does not have)."""
    env = {
        "ANTHROPIC_BASE_URL": url,
        "ANTHROPIC_AUTH_TOKEN": PROVIDER,  # required by Claude Code, ignored by the daemon
        "ANTHROPIC_API_KEY": "",
        "ANTHROPIC_MODEL": model,
        "ANTHROPIC_DEFAULT_OPUS_MODEL": model,
        "ANTHROPIC_DEFAULT_SONNET_MODEL": model,
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": model,
    }
    path = _home("CLAUDE_CONFIG_DIR", ".claude") / "settings.json"

    def merge(text: str | None) -> str:
        data = _json_object(text, path)
        data["env"] = {**(data.get("env") or {}), **env}
        return json.dumps(data, indent=2, ensure_ascii=False) + "\n"

    snippet = json.dumps({"env": env}, indent=2)
    command = f"claude --model {shlex.quote(model)}"
    return AgentSetup("Claude Code", model, env, path, snippet, merge, command)


def codex(url: str, model: str) -> AgentSetup:
    """Codex: a model provider on the daemon's Responses API and a profile that uses it."""
    snippet = (
        f"[model_providers.{PROVIDER}]\n"
        f'name = "modelhub"\n'
        f"base_url = {json.dumps(url + '/v1')}\n"
        f'wire_api = "responses"\n'
        f"\n[profiles.{PROVIDER}]\n"
        f"model = {json.dumps(model)}\n"
        f'model_provider = "{PROVIDER}"\n'
    )
    path = _home("CODEX_HOME", ".codex") / "config.toml"

    def merge(text: str | None) -> str:
        old = text or ""
        _toml(old, path)
        kept = _without_tables(old, (f"model_providers.{PROVIDER}", f"profiles.{PROVIDER}"))
        new = (kept.rstrip("\n") + "\n\n" if kept.strip() else "") + snippet
        _toml(new, path)
        return new

    return AgentSetup("Codex", model, {}, path, snippet, merge, f"codex --profile {PROVIDER}")


def opencode(url: str, model: str) -> AgentSetup:
    """opencode: an OpenAI-compatible provider on the daemon, and its model as the default."""
    provider = {
        "npm": "@ai-sdk/openai-compatible",
        "name": "modelhub",
        "options": {"baseURL": url + "/v1"},
        "models": {model: {"name": model}},
    }
    entries = {"provider": {PROVIDER: provider}, "model": f"{PROVIDER}/{model}"}
    path = _home("XDG_CONFIG_HOME", ".config") / "opencode" / "opencode.json"

    def merge(text: str | None) -> str:
        data = _json_object(text, path)
        data.setdefault("$schema", "https://opencode.ai/config.json")
        data["provider"] = {**(data.get("provider") or {}), PROVIDER: provider}
        data["model"] = entries["model"]
        return json.dumps(data, indent=2, ensure_ascii=False) + "\n"

    snippet = json.dumps(entries, indent=2)
    command = f"opencode --model {shlex.quote(PROVIDER + '/' + model)}"
    return AgentSetup("opencode", model, {}, path, snippet, merge, command)


AGENTS: dict[str, Callable[[str, str], AgentSetup]] = {
    "claude": claude,
    "codex": codex,
    "opencode": opencode,
}


def _json_object(text: str | None, path: Path) -> dict[str, Any]:
    if not text or not text.strip():
        return {}
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise InputError(
            f"{path} is not plain JSON ({exc}); add the entries printed without --write by hand"
        ) from None
    if not isinstance(data, dict):
        raise InputError(f"{path} does not hold a JSON object; add the entries by hand")
    return data


def _toml(text: str, path: Path) -> None:
    try:
        tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"{path} is not valid TOML ({exc}); add the entries by hand") from None


def _without_tables(text: str, names: tuple[str, ...]) -> str:
    """``text`` without the TOML tables ``names`` (each from its header to the next one)."""
    out, skipping = [], False
    for line in text.splitlines(keepends=True):
        header = re.match(r"\s*\[([^\[\]]+)\]\s*(#.*)?$", line)
        if header:
            skipping = header.group(1).strip().replace('"', "") in names
        if not skipping:
            out.append(line)
    return "".join(out)


def write_config(setup: AgentSetup) -> Path | None:
    """Merge the entries into the agent's config; the old file, if any, is copied aside
    first (returned). Unchanged content is not rewritten."""
    path = setup.path
    old = path.read_text(encoding="utf-8") if path.exists() else None
    new = setup.merge(old)
    if new == old:
        return None
    backup = None
    if old is not None:
        backup = path.with_name(f"{path.name}.bak-{datetime.now():%Y%m%d-%H%M%S}")
        shutil.copy2(path, backup)
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(f".{path.name}.modelhub-tmp")
    temp.write_text(new, encoding="utf-8")
    os.replace(temp, path)
    return backup


def _exports(env: dict[str, str]) -> str:
    return "\n".join(f"  export {k}={shlex.quote(v)}" for k, v in env.items())


def _default_model() -> str:
    from modelhub.cli.models import connect

    with connect() as client:
        names = sorted(str(m.get("name") or m.get("model")) for m in client.list())
    if len(names) == 1:
        return names[0]
    if not names:
        raise InputError("no models yet: pull or create one, then pass it with --model")
    raise InputError("choose a model with --model: " + ", ".join(names))


@click.command("launch")
@click.argument("agent", type=click.Choice(sorted(AGENTS)))
@click.option("-m", "--model", help="The model the agent uses (default: the only one there is).")
@click.option("--write", is_flag=True, help="Write the agent's config file (backed up first).")
def launch(agent: str, model: str | None, write: bool) -> None:
    """Point a coding agent (Claude Code, Codex, opencode) at this daemon.

    Prints the environment variables or config entries that make AGENT use modelhub and
    MODEL; with --write, merges them into the agent's config file, copying the old one to
    <file>.bak-<time> first. Nothing is installed or started.
    """
    setup = AGENTS[agent](daemon_url(), model or _default_model())
    if write:
        backup = write_config(setup)
        click.echo(f"Wrote {setup.path}" + (f" (the old one is {backup})" if backup else ""))
        click.echo(f"Start {setup.title} with:\n  {setup.command}")
        return
    click.echo(f"{setup.title} on modelhub at {daemon_url()}:\n")
    if setup.env:
        click.echo(f"Set these variables:\n{_exports(setup.env)}\n")
        click.echo(f"or these entries in {setup.path}:")
    else:
        click.echo(f"Add these entries to {setup.path}:")
    click.echo(setup.snippet.rstrip("\n") + "\n")
    click.echo(f"Then start {setup.title}:\n  {setup.command}\n")
    again = f"modelhub launch {agent} --model {shlex.quote(setup.model)} --write"
    click.echo(f"`{again}` writes the file for you (the old one is backed up first).")
