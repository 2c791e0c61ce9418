"""The ``modelhub`` click group, the error policy and the entry point ``main()``.

Errors of our hierarchy print ``Error: <message>`` on stderr, never a traceback, and exit with
a status that says what kind of failure it was (docs/cli.md, "Errors"): 1 for an error the
daemon or the command reported, 2 for a usage mistake (click's), 69 when the daemon cannot be
reached, 130 when interrupted (Ctrl-C).
"""

from __future__ import annotations

import sys
from typing import Any

import click
import httpx

from modelhub import __version__
from modelhub.cli import bench, info, launch, models, pull, rpc_worker, run, runtime, serve
from modelhub.client import Client
from modelhub.config import Settings
from modelhub.errors import DaemonUnreachableError, ModelhubError

EXIT_ERROR = 1
EXIT_UNREACHABLE = 69  # sysexits' EX_UNAVAILABLE
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report it


class CommandFailed(click.ClickException):
    """``Error: <message>``, exit status 1."""


class DaemonUnreachable(CommandFailed):
    """``Error: <message>``, exit status 69."""

    exit_code = EXIT_UNREACHABLE


CLIENT_ENVIRONMENT = """\b
Environment:
  MODELHUB_HOST           Address of the daemon (default 127.0.0.1:11435)
  MODELHUB_NO_AUTOSTART   Do not start a daemon in the background when none answers"""


class ModelhubGroup(click.Group):
    """A click group that turns our errors into ``Error: ...`` and their exit status."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except DaemonUnreachableError as exc:
            raise DaemonUnreachable(exc.message) from None
        except ModelhubError as exc:
            raise CommandFailed(exc.message) from None
        except (KeyboardInterrupt, click.Abort):
            click.echo("", err=True)
            sys.exit(EXIT_INTERRUPTED)
        except httpx.HTTPError as exc:  # anything the client did not already translate
            raise CommandFailed(f"talking to the daemon failed: {exc}") from None
        except BrokenPipeError:  # output piped into `head` and the like: stop quietly
            sys.stderr.close()
            sys.exit(1)
        except OSError as exc:  # e.g. a file that vanished between hashing and upload
            where = f": {exc.filename}" if exc.filename else ""
            raise CommandFailed(f"{exc.strerror or exc}{where}") from None


def _print_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    """``modelhub --version``: the daemon's version, and the client's when they differ."""
    if not value or ctx.resilient_parsing:
        return
    try:
        with Client(Settings.from_env().base_url, timeout=5.0) as client:
            server_version = client.version()
    except ModelhubError:
        click.echo("Warning: could not connect to a running modelhub daemon", err=True)
        click.echo(f"Warning: client version is {__version__}", err=True)
    else:
        click.echo(f"modelhub version is {server_version}")
        if server_version != __version__:
            click.echo(f"Warning: client version is {__version__}", err=True)
    ctx.exit()


@click.group(
    cls=ModelhubGroup,
    context_settings={"help_option_names": ["-h", "--help"]},
    epilog=CLIENT_ENVIRONMENT,
)
@click.option(
    "-v",
    "--version",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_print_version,
    help="Show the daemon's version (and the client's if different) and exit.",
)
def cli() -> None:
    """Large language model runner with lossless speculative decoding.

    Commands talk to the modelhub daemon over HTTP; if none is running on this machine,
    one is started in the background (see `modelhub serve --help`).
    """


cli.add_command(serve.serve)
cli.add_command(models.create)
cli.add_command(models.show)
cli.add_command(models.list_models)
cli.add_command(models.list_models, name="ls")
cli.add_command(models.verify)
cli.add_command(models.copy)
cli.add_command(models.remove)
cli.add_command(run.run)
cli.add_command(runtime.ps)
cli.add_command(runtime.stop)
cli.add_command(pull.pull)
cli.add_command(pull.prune)
cli.add_command(bench.bench)
cli.add_command(info.info)
cli.add_command(launch.launch)
cli.add_command(rpc_worker.rpc_worker)


def main() -> None:
    """Entry point of the ``modelhub`` command."""
    try:
        cli.main(prog_name="modelhub")
    except ModelhubError as exc:  # raised while parsing options (e.g. a bad config file)
        click.echo(f"Error: {exc.message}", err=True)
        sys.exit(EXIT_ERROR)
