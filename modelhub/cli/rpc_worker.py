"""``modelhub rpc-worker``: run a ggml RPC worker in the foreground.

The worker is the engine's (ggml's RPC server), which the CLI may not import: it replaces this
process with ``python -m modelhub.engine.rpc_worker``, so Ctrl-C and signals reach it directly.
"""

from __future__ import annotations

import os
import sys

import click

RPC_HELP = """Serve this machine's CPU to a modelhub daemon on another machine (ggml RPC).

The daemon, started with MODELHUB_RPC_SERVERS=host:port,..., splits a model's layers
across its own devices and the workers; every token's activations then cross the
network. Needs llama-cpp-python built with -DGGML_RPC=on (see docs/distributed.md).

The RPC protocol has no authentication: by default the worker listens on loopback
only, and another address needs --allow-remote. Expose it only on a network you trust.
"""


@click.command("rpc-worker", help=RPC_HELP)
@click.option(
    "--host",
    default="127.0.0.1:50052",
    show_default=True,
    metavar="ADDR:PORT",
    help="Address and port to listen on.",
)
@click.option("--threads", type=int, default=0, help="CPU threads (default: all cores).")
@click.option(
    "--cache",
    type=click.Path(file_okay=False),
    default=None,
    help="Directory where the worker caches tensors it received (faster reloads).",
)
@click.option(
    "--allow-remote",
    is_flag=True,
    help="Allow listening on a non-loopback address (unauthenticated: trusted networks only).",
)
def rpc_worker(host: str, threads: int, cache: str | None, allow_remote: bool) -> None:
    argv = [sys.executable, "-m", "modelhub.engine.rpc_worker", "--host", host]
    argv += ["--threads", str(threads)]
    if cache:
        argv += ["--cache", cache]
    if allow_remote:
        argv.append("--allow-remote")
    sys.stdout.flush()
    os.execv(sys.executable, argv)
