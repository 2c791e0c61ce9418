"""Pull throughput and memory: our pull vs a plain httpx streaming copy of the same bytes.

    python bench/pull.py [--size-mb 1024] [--rounds 2] [--parallel 4]

A blob of random bytes is served from loopback by a registry in its own process (sendfile,
so the server costs little CPU). In separate client processes, measured alternately:

* baseline: ``httpx`` streams the blob into a file (GET, iterate, write, fsync);
* candidate: ``modelhub.pull.pull_model`` pulls it into a fresh store (ranged parts, sha256
  while streaming, resume state, fsync, rename, manifest).

Printed: throughput of each (best round), the ratio (goal >= 0.8), and each client's peak RSS
above its RSS just before the transfer (goal: flat, < 100 MB above baseline).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]


def _rss_mb() -> float:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6


class _RssSampler(threading.Thread):
    """Samples RSS every 50 ms, so the report shows how flat memory stays."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.samples: list[float] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.05):
            self.samples.append(_rss_mb())


def _measure(action: str, args: argparse.Namespace) -> dict[str, float]:
    """Run one transfer in this (child) process and report time and memory."""
    import httpx

    from modelhub.library.pulled import installer
    from modelhub.pull import DownloadPolicy, pull_model
    from modelhub.store import Store

    before = _rss_mb()
    sampler = _RssSampler()
    sampler.start()
    work = Path(args.work)
    started = time.perf_counter()
    if action == "baseline":
        target = work / "baseline.bin"
        with httpx.Client(timeout=60) as client, client.stream("GET", args.url) as response:
            response.raise_for_status()
            with open(target, "wb") as out:
                for chunk in response.iter_raw():
                    out.write(chunk)
                out.flush()
                os.fsync(out.fileno())
        size = target.stat().st_size
        target.unlink()
    else:
        store = Store(work / "store")
        policy = DownloadPolicy(parallel=args.parallel)  # the defaults but --parallel
        pull_model(
            store,
            args.name,
            insecure=True,
            progress=lambda item: None,
            install=installer(store),
            policy=policy,
        )
        size = sum(f.stat().st_size for f in store.blobs_dir.iterdir())
        shutil.rmtree(work / "store")
    elapsed = time.perf_counter() - started
    sampler.stop.set()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3
    return {
        "seconds": elapsed,
        "bytes": size,
        "rss_before": before,
        "rss_peak": max(peak, *sampler.samples, before),
    }


def _serve(path: Path) -> None:
    """Child process: a registry serving ``path`` as the only layer of bench/blob:latest."""
    from devtools.pullservers import MEDIA_MANIFEST, RegistryServer

    registry = RegistryServer().start()
    digest = registry.add_blob(path)  # served from the file, hashed with modelhub's sha256_file
    config = b'{"model_format":"gguf","architecture":"amd64","os":"linux"}'
    config_digest = registry.add_blob(config)
    manifest = {
        "schemaVersion": 2,
        "mediaType": MEDIA_MANIFEST,
        "config": {
            "mediaType": "application/vnd.docker.container.image.v1+json",
            "digest": config_digest,
            "size": len(config),
        },
        "layers": [
            {
                "mediaType": "application/vnd.ollama.image.model",
                "digest": digest,
                "size": path.stat().st_size,
            }
        ],
    }
    registry.manifests["bench/blob:latest"] = json.dumps(manifest).encode()
    print(
        json.dumps({"host": registry.host, "url": f"{registry.url}/v2/bench/blob/blobs/{digest}"}),
        flush=True,
    )
    sys.stdin.read()  # until the parent closes our stdin
    registry.stop()


def _child(action: str, **values: str) -> dict[str, float]:
    command = [sys.executable, __file__, "--child", action]
    for key, value in values.items():
        command += [f"--{key}", value]
    output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    return dict(json.loads(output.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mb", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--parallel", type=int, default=4)
    parser.add_argument("--child", choices=["baseline", "pull", "serve"])
    parser.add_argument("--url", default="")
    parser.add_argument("--name", default="")
    parser.add_argument("--work", default="")
    parser.add_argument("--blob", default="")
    args = parser.parse_args()
    if args.child == "serve":
        _serve(Path(args.blob))
        return
    if args.child:
        print(json.dumps(_measure(args.child, args)))
        return

    with tempfile.TemporaryDirectory(prefix="modelhub-bench-pull-") as tmp:
        work = Path(tmp)
        blob = work / "blob.bin"
        with open(blob, "wb") as out:
            for _ in range(args.size_mb):
                out.write(os.urandom(1 << 20))
        server = subprocess.Popen(
            [sys.executable, __file__, "--child", "serve", "--blob", str(blob)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert server.stdout is not None
            info = json.loads(server.stdout.readline())
            name = f"{info['host']}/bench/blob:latest"
            results: dict[str, list[dict[str, float]]] = {"baseline": [], "pull": []}
            for _ in range(args.rounds):
                results["baseline"].append(_child("baseline", url=info["url"], work=str(work)))
                results["pull"].append(
                    _child("pull", name=name, work=str(work), parallel=str(args.parallel))
                )
        finally:
            assert server.stdin is not None
            server.stdin.close()
            server.wait(10)
    _report(results, args)


def _report(results: dict[str, list[dict[str, float]]], args: argparse.Namespace) -> None:
    def best(kind: str) -> dict[str, float]:
        return min(results[kind], key=lambda r: r["seconds"])

    base, pull = best("baseline"), best("pull")
    rate = {k: r["bytes"] / r["seconds"] / 1e6 for k, r in (("baseline", base), ("pull", pull))}
    print(
        f"blob: {args.size_mb} MiB from loopback, best of {args.rounds} rounds, "
        f"{args.parallel} parallel parts, {os.cpu_count()} CPUs"
    )
    print(f"{'':<28}{'MB/s':>10}{'seconds':>10}{'RSS before':>12}{'RSS peak':>10}{'growth':>9}")
    for label, kind in (("httpx streaming copy", "baseline"), ("modelhub pull", "pull")):
        r = best(kind)
        print(
            f"{label:<28}{rate[kind]:>10.0f}{r['seconds']:>10.2f}{r['rss_before']:>10.0f}MB"
            f"{r['rss_peak']:>8.0f}MB{r['rss_peak'] - r['rss_before']:>7.0f}MB"
        )
    ratio = rate["pull"] / rate["baseline"]
    growth = max(r["rss_peak"] - r["rss_before"] for r in results["pull"])
    print(f"throughput ratio (pull / copy): {ratio:.2f}  (goal >= 0.8)")
    print(f"pull RSS growth, worst round: {growth:.0f} MB  (goal < 100 MB)")


if __name__ == "__main__":
    main()
