"""``modelhub serve``: run the daemon in the foreground."""

from __future__ import annotations

import click

from modelhub.config import Settings

SERVE_HELP = """Start the modelhub daemon in the foreground (Ctrl-C stops it).

Other commands start one in the background when none answers; run it yourself to
see its log, or to serve on another address.

\b
Environment:
  MODELHUB_HOST               Address to listen on (default 127.0.0.1:11435)
  MODELHUB_MODELS             Directory of the model store
  MODELHUB_KEEP_ALIVE         How long a model stays loaded after use (default "5m")
  MODELHUB_ORIGINS            Extra allowed browser origins, comma separated
  MODELHUB_MAX_LOADED_MODELS  Models kept loaded at once (default 3)
  MODELHUB_NUM_PARALLEL       Requests served at once per model (default 4, or 1 if memory is short)
  MODELHUB_NUM_THREADS        CPU threads per model (default: all cores)
  MODELHUB_CONTEXT_LENGTH     Default num_ctx in tokens (default 4096)
  MODELHUB_MAX_QUEUE          Requests that may wait before "server busy" (default 512)
  MODELHUB_NOPRUNE            Keep unreferenced blobs when overwriting a model
  MODELHUB_MEMORY_LIMIT       Memory all loaded models may use together (e.g. "8GiB")
  MODELHUB_REPACK             CPU weight repacking: auto (default), on or off
  MODELHUB_KV_CACHE_TYPE      KV cache type: auto (default: exact drafting on CPU), f16, q8_0, q4_0
  MODELHUB_FLASH_ATTENTION    Flash attention: on (default: exact drafting on CPU) or off
  MODELHUB_NUM_GPU            Layers offloaded when a model does not say: -1 (default: as many
                              as fit), 0 (CPU only) or a count
  MODELHUB_RPC_SERVERS        ggml RPC workers to split models across, host:port,... (see
                              `modelhub rpc-worker --help`)
  MODELHUB_RUNNER_TIMEOUT     Seconds a model's runner may say nothing before it is killed and
                              replaced (default 30; 0: never)
  MODELHUB_CONFIG             YAML settings file (default: config.yaml in the user config dir)
"""


@click.command("serve", help=SERVE_HELP)
def serve() -> None:
    settings = Settings.from_env()
    # Imported here: the server stack is heavy and only this command needs it.
    from modelhub.server.app import serve as run_daemon

    run_daemon(settings)
