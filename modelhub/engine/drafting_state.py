"""What drafting learned about a model on this machine, kept across requests and loads.

A model's state directory (``<models>/drafting/<weights digest>/``, given to the engine as
``EngineConfig.state_dir``) holds ``drafting.json``: the controllers' estimates (acceptance and
cost per guess per drafter, kind of request and batch load), the target's verify costs, how
many requests each drafter drafted for, and a summary that ``modelhub show`` prints while the
model is not loaded; and ``ngram.bin``, the model's n-gram pool (unless
``EngineConfig.ngram_persist`` is off). Costs depend on threads, cache type and offload: they
are restored only under the conditions they were measured in, acceptance always. A missing or
damaged file means starting afresh, never an error.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from modelhub.engine.speculative.adaptive import AdaptiveDraftLength
from modelhub.engine.speculative.costs import VerifyCosts, restore_verify_costs, verify_costs_state
from modelhub.engine.speculative.ngram_file import write_atomic

if TYPE_CHECKING:
    from modelhub.engine.options import EngineConfig, GenerateResult
    from modelhub.engine.speculative.ngram import NgramPool

log = logging.getLogger("modelhub.engine")

STATE_FILE = "drafting.json"
NGRAM_FILE = "ngram.bin"
_VERSION = 1
# Saved at most this often while requests run (and always when the model is unloaded).
_SAVE_EVERY_S = 30.0
ControllerKey = tuple[str, str, int]  # (drafter name, kind of request, batch load)


def _key(key: ControllerKey) -> str:
    return f"{key[0]}|{key[1]}|{key[2]}"


class DraftingMemory:
    """The state directory of one loaded model (see the module docstring)."""

    def __init__(self, state_dir: Path | None, conditions: dict[str, object]) -> None:
        self.dir = state_dir
        self.conditions = conditions
        self._verify: dict[tuple[str, int], VerifyCosts] = {}
        self._saved: dict[str, Any] = {}
        self.requests: dict[str, int] = {}
        self.total_requests = 0
        self._saved_summary: dict[str, Any] | None = None
        self._saving: threading.Thread | None = None
        self._last_save = time.monotonic()
        self._load()

    # ---- reading -----------------------------------------------------------------------------
    def _load(self) -> None:
        doc = self._read()
        if doc is None:
            return
        same = doc.get("conditions") == json.loads(json.dumps(self.conditions))
        controllers = doc.get("controllers")
        if isinstance(controllers, dict):
            self._saved = controllers
        requests = doc.get("requests")
        if isinstance(requests, dict):
            self.requests = {str(k): int(v) for k, v in requests.items() if isinstance(v, int)}
        summary = doc.get("summary")
        self._saved_summary = summary if isinstance(summary, dict) else None
        total = doc.get("total_requests")
        self.total_requests = total if isinstance(total, int) else 0
        verify = doc.get("verify") if same else None
        if isinstance(verify, dict):
            for key, table in verify.items():
                klass, _, load = str(key).partition("|")
                if load.isdigit():
                    self._verify[(klass, int(load))] = restore_verify_costs(table)
        if not same:  # other threads, cache or offload: keep acceptance, measure costs again
            for state in self._saved.values():
                if isinstance(state, dict):
                    state.update(draft=None, catch_up=None)

    def _read(self) -> dict[str, Any] | None:
        if self.dir is None:
            return None
        path = self.dir / STATE_FILE
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            log.warning("%s is unreadable (%s): drafting starts afresh", path, exc)
            return None
        if not isinstance(doc, dict) or doc.get("version") != _VERSION:
            return None
        return doc

    def verify_costs(self, klass: str, load: int) -> VerifyCosts:
        """The target's verify-cost table for a kind of request and batch load (shared)."""
        return self._verify.setdefault((klass, load), {})

    def restore(self, controller: AdaptiveDraftLength, key: ControllerKey) -> None:
        controller.restore(self._saved.get(_key(key)))

    def load_ngram_pool(self, persist: bool) -> NgramPool | None:
        """The saved n-gram pool (None: none saved, or persistence off)."""
        if self.dir is None or not persist:
            return None
        from modelhub.engine.speculative.ngram import NgramPool

        path = self.dir / NGRAM_FILE
        return NgramPool.load(path) if path.exists() else None

    # ---- writing -----------------------------------------------------------------------------
    def count_request(self, result: GenerateResult) -> None:
        self.total_requests += 1
        if result.drafter_name:
            self.requests[result.drafter_name] = self.requests.get(result.drafter_name, 0) + 1

    def maybe_save(
        self, controllers: dict[ControllerKey, AdaptiveDraftLength], pool: NgramPool | None
    ) -> None:
        """Save in the background when the last save is old enough (writing a full n-gram
        pool takes a few hundred milliseconds: not on the thread that decodes). Readers of
        the pool race with its writers harmlessly: a torn entry is at worst a wrong guess."""
        if self.dir is None or time.monotonic() - self._last_save < _SAVE_EVERY_S:
            return
        if self._saving is not None and self._saving.is_alive():
            return
        self._last_save = time.monotonic()
        snapshot = dict(controllers)
        self._saving = threading.Thread(target=self.save, args=(snapshot, pool), daemon=True)
        self._saving.start()

    def close(
        self, controllers: dict[ControllerKey, AdaptiveDraftLength], pool: NgramPool | None
    ) -> None:
        """The model is unloading: wait for a background save, then save once more."""
        if self._saving is not None:
            self._saving.join()
        self.save(controllers, pool)

    def save(
        self, controllers: dict[ControllerKey, AdaptiveDraftLength], pool: NgramPool | None
    ) -> None:
        """Write the state (atomically); a failure is logged, never raised."""
        self._last_save = time.monotonic()
        if self.dir is None:
            return
        controllers = dict(controllers)  # the batch thread may add one meanwhile
        try:
            doc = self._document(controllers)
        except RuntimeError:  # the batch thread grew a table while it was read: next time
            log.debug("drafting state changed while it was saved; saving later")
            return
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            write_atomic(self.dir / STATE_FILE, json.dumps(doc, indent=1).encode())
            if pool is not None:
                pool.save(self.dir / NGRAM_FILE)
        except OSError as exc:
            log.warning("could not keep what drafting learned in %s: %s", self.dir, exc)

    def _document(self, controllers: dict[ControllerKey, AdaptiveDraftLength]) -> dict[str, Any]:
        saved = dict(self._saved)
        saved.update({_key(k): c.state() for k, c in controllers.items()})
        verify = dict(self._verify)
        return {
            "version": _VERSION,
            "conditions": self.conditions,
            "verify": {f"{k}|{n}": verify_costs_state(t) for (k, n), t in verify.items()},
            "controllers": saved,
            "requests": dict(self.requests),
            "total_requests": self.total_requests,
            "summary": self.report(controllers, None),
        }

    # ---- what a user is shown ------------------------------------------------------------------
    def report(
        self, controllers: dict[ControllerKey, AdaptiveDraftLength], names: list[str] | None
    ) -> dict[str, Any]:
        """Per drafter, plain requests one at a time: acceptance, cost per guess against a
        target step, the best length, the expected speed-up and the evidence; and the drafter
        with the best expected speed-up (None: none is expected to pay)."""
        rows: list[dict[str, Any]] = []
        for (name, klass, load), ctl in sorted(dict(controllers).items()):
            if klass != "plain" or load != 1 or (names is not None and name not in names):
                continue
            plain = ctl.rate(0)
            state = ctl.state()
            # A rated drafter (n-gram) guesses only where it has a match: one acceptance figure
            # does not predict its speed-up, so none is shown for it.
            best = None if state["rated"] else ctl.best_rate()
            draft_s = state["draft"]
            step = ctl.verify_cost(1)
            rows.append(
                {
                    "name": name,
                    "acceptance": round(ctl.acceptance, 3),
                    "cost_per_guess": round(float(draft_s) / step, 3)
                    if isinstance(draft_s, float) and step
                    else None,
                    "rated": bool(state["rated"]),
                    "best_length": ctl.best_k() if plain and best else None,
                    "expected_speedup": round(best / plain, 2) if best and plain else None,
                    "rounds": ctl.draft_rounds,
                    "requests": self.requests.get(name, 0),
                }
            )
        if not rows and self._saved_summary is not None:
            return self._saved_summary  # nothing measured since the load: the last figures
        # In use: the model drafter expected to pay most, else n-gram where it has measured
        # accepted guesses (it drafts only where it has a match, so it never costs much).
        paying = [r for r in rows if (r["expected_speedup"] or 0.0) > 1.0]
        best_row = max(paying, key=lambda r: r["expected_speedup"] or 0.0, default=None)
        if best_row is None:
            best_row = next((r for r in rows if r["rated"] and r["acceptance"] > 0), None)
        return {
            "drafters": rows,
            "in_use": best_row["name"] if best_row else None,
            "requests": self.total_requests,
        }


class DraftLearning:
    """A loaded model's controllers (one per drafter, kind of request and batch load) and the
    state directory they are kept in across loads."""

    def __init__(self, cfg: EngineConfig, conditions: dict[str, object]) -> None:
        self.adaptive = cfg.adaptive
        self.memory = DraftingMemory(cfg.state_dir, conditions)
        self.controllers: dict[ControllerKey, AdaptiveDraftLength] = {}

    def controller(self, name: str, klass: str, load: int, k_max: int) -> AdaptiveDraftLength:
        """One controller per drafter, kind of request and batch load, kept across requests
        (and loads) and shared by the slots: the costs it measures are those of the batches
        the requests run in; the verify costs are shared by the drafters of the same kind of
        request and load."""
        key = (name, klass, load)
        ctl = self.controllers.get(key)
        if ctl is None:
            costs = self.memory.verify_costs(klass, load)
            ctl = AdaptiveDraftLength(k_max, verify=costs, adaptive=self.adaptive)
            self.memory.restore(ctl, key)
            self.controllers[key] = ctl
        ctl.max_k = k_max
        return ctl

    def finished(self, result: GenerateResult, pool: NgramPool | None) -> None:
        self.memory.count_request(result)
        self.memory.maybe_save(self.controllers, pool)

    def report(self, names: list[str]) -> dict[str, Any]:
        for _ in range(3):  # the batch thread may grow a cost table while it is read
            try:
                return self.memory.report(self.controllers, names)
            except RuntimeError:
                continue
        return {"drafters": [], "in_use": None, "requests": self.memory.total_requests}

    def close(self, pool: NgramPool | None) -> None:
        self.memory.close(self.controllers, pool)
