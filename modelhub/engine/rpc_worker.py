"""``python -m modelhub.engine.rpc_worker``: a ggml RPC worker (what ``modelhub rpc-worker``
runs), serving this machine's CPU to a daemon that splits a model's layers across workers.

The protocol has no authentication and no encryption: whoever reaches the port can allocate
memory and run computations on this machine. So the worker listens on loopback unless told
otherwise, and refuses another address without ``--allow-remote``.
"""

from __future__ import annotations

import argparse
import sys

from modelhub.engine.devices import NO_RPC, is_loopback, parse_endpoint, rpc_supported, serve_rpc
from modelhub.engine.native import default_threads
from modelhub.errors import ModelhubError

DEFAULT_ENDPOINT = "127.0.0.1:50052"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="modelhub rpc-worker")
    parser.add_argument("--host", default=DEFAULT_ENDPOINT)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--cache", default=None)
    parser.add_argument("--allow-remote", action="store_true")
    args = parser.parse_args(argv)
    try:
        host, port = parse_endpoint(args.host)
        if not is_loopback(host) and not args.allow_remote:
            raise ModelhubError(
                f"refusing to listen on {args.host}: the RPC protocol has no authentication, "
                "so anyone who reaches this port can use this machine's memory and CPU. Use a "
                "private network you trust and pass --allow-remote (docs/distributed.md)"
            )
        if not rpc_supported():
            raise ModelhubError(NO_RPC)
        threads = args.threads if args.threads > 0 else default_threads()
        endpoint = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        print(f"modelhub rpc-worker: serving on {endpoint} with {threads} threads", flush=True)
        serve_rpc(endpoint, threads, args.cache)
    except ModelhubError as exc:
        print(f"Error: {exc.message}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
