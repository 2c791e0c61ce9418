"""``modelhub launch AGENT`` in-process, with a temporary HOME: what it prints, that nothing is
written without --write, and how --write merges into each agent's config and backs it up."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
from click.testing import CliRunner

from modelhub.cli.main import cli


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HOME", str(tmp_path))
    for name in ("CLAUDE_CONFIG_DIR", "CODEX_HOME", "XDG_CONFIG_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MODELHUB_HOST", "0.0.0.0:12345")  # a wildcard bind: reached on loopback
    return tmp_path


def _launch(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["launch", *args])
    return result.exit_code, result.output


def test_without_write_it_prints_what_to_set_and_writes_nothing(home: Path) -> None:
    code, out = _launch("claude", "--model", "qwen3:8b")
    assert code == 0, out
    assert "export ANTHROPIC_BASE_URL=http://127.0.0.1:12345\n" in out
    assert "export ANTHROPIC_AUTH_TOKEN=modelhub" in out and "ANTHROPIC_API_KEY=''" in out
    assert "export ANTHROPIC_DEFAULT_HAIKU_MODEL=qwen3:8b" in out
    assert "claude --model qwen3:8b" in out
    code, out = _launch("codex", "-m", "qwen3:8b")
    assert code == 0 and 'base_url = "http://127.0.0.1:12345/v1"' in out
    assert 'wire_api = "responses"' in out and "codex --profile modelhub" in out
    code, out = _launch("opencode", "-m", "qwen3:8b")
    assert code == 0 and '"model": "modelhub/qwen3:8b"' in out
    assert list(home.iterdir()) == []  # nothing written, nothing installed


def test_claude_settings_are_merged_and_the_old_file_backed_up(home: Path) -> None:
    settings = home / ".claude" / "settings.json"
    settings.parent.mkdir()
    old = {"theme": "dark", "env": {"KEEP": "1", "ANTHROPIC_MODEL": "claude-x"}}
    settings.write_text(json.dumps(old))
    code, out = _launch("claude", "--model", "coder", "--write")
    assert code == 0, out
    data = json.loads(settings.read_text())
    assert data["theme"] == "dark" and data["env"]["KEEP"] == "1"
    assert data["env"]["ANTHROPIC_MODEL"] == "coder"
    assert data["env"]["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:12345"
    (backup,) = settings.parent.glob("settings.json.bak-*")
    assert json.loads(backup.read_text()) == old and str(backup) in out
    code, out = _launch("claude", "--model", "coder", "--write")  # nothing new: no new backup
    assert code == 0 and len(list(settings.parent.glob("settings.json.bak-*"))) == 1


def test_codex_config_keeps_the_users_tables_and_replaces_its_own(home: Path) -> None:
    config = home / ".codex" / "config.toml"
    config.parent.mkdir()
    old = (
        'model = "o3"\n\n[profiles.modelhub]\nmodel = "stale"\nmodel_provider = "modelhub"\n\n'
        '[mcp_servers.docs]\ncommand = "docs-server"\n'
    )
    config.write_text(old)
    code, out = _launch("codex", "--model", "coder", "--write")
    assert code == 0, out
    data = tomllib.loads(config.read_text())
    assert data["model"] == "o3" and data["mcp_servers"]["docs"]["command"] == "docs-server"
    assert data["profiles"]["modelhub"] == {"model": "coder", "model_provider": "modelhub"}
    provider = data["model_providers"]["modelhub"]
    assert (
        provider["base_url"] == "http://127.0.0.1:12345/v1" and provider["wire_api"] == "responses"
    )
    (backup,) = config.parent.glob("config.toml.bak-*")
    assert backup.read_text() == old


def test_opencode_config_is_created_and_a_file_it_cannot_read_is_left_alone(home: Path) -> None:
    config = home / ".config" / "opencode" / "opencode.json"
    code, out = _launch("opencode", "--model", "coder", "--write")
    assert code == 0, out
    data = json.loads(config.read_text())
    assert data["model"] == "modelhub/coder"
    provider = data["provider"]["modelhub"]
    assert provider["options"]["baseURL"] == "http://127.0.0.1:12345/v1"
    assert provider["models"] == {"coder": {"name": "coder"}}
    assert not list(config.parent.glob("*.bak-*"))  # there was nothing to back up

    commented = '{\n  // mine\n  "model": "x/y"\n}\n'
    config.write_text(commented)
    code, out = _launch("opencode", "--model", "coder", "--write")
    assert code == 1 and "is not plain JSON" in out
    assert config.read_text() == commented and not list(config.parent.glob("*.bak-*"))
