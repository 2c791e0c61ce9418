"""Model-free drafting from n-grams already seen (prompt, output, and earlier requests).

An :class:`NgramPool` maps the hash of ``n`` consecutive tokens to the token that followed them
most recently, for every order ``n`` in ``orders`` (1, 2, 3, 4, 6, 8, 12, 16 by default). Short
orders find something to draft almost anywhere; long ones tell apart the places where a short
n-gram recurs with different continuations (code repeats ``    count = `` with many endings), so
a copy follows the right source. It is filled incrementally: each token that enters a sequence
costs one table write per order, and a prompt that starts like a sequence the pool has already
indexed (a chat that grows turn by turn, a repeated system prompt) is indexed only from where it
differs. One pool per loaded model lets a request draft from what earlier requests produced.

:class:`NgramDrafter` drafts by following the chain: look up the longest suffix of the
sequence that has an entry, append the stored token, repeat.

Memory is bounded: the table has a fixed number of slots (``capacity``, 13 bytes each; 2^20 slots
= 13.6 MB by default) and a colliding write replaces the older entry, so old material fades
instead of growing the table. The prefix memory keeps at most ``max_sequences`` sequences of at
most ``max_sequence_tokens`` tokens each (4 bytes a token; 8 x 2^17 tokens = 4 MB).

A pool outlives its process through :meth:`NgramPool.save` and :meth:`NgramPool.load`: the
table (not the prefix memory) in a file of at most a few MB (``ngram_file.py`` has the format);
when the table holds more than that, the entries the most recent sequences reach are kept
first, then those seen most often.
"""

from __future__ import annotations

import threading
from array import array
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from modelhub.engine.speculative.base import ProbabilityFn, Proposal
from modelhub.engine.speculative.confidence import AcceptanceByClass
from modelhub.engine.speculative.ngram_file import (
    DEFAULT_MAX_BYTES,
    NgramEntries,
    encode,
    max_entries,
    read_entries,
    select_entries,
    slots_for,
    write_atomic,
)

_MASK64 = (1 << 64) - 1
_MULTIPLIER = 0x9E3779B97F4A7C15  # odd 64-bit constant (golden ratio): a good multiplicative hash
_SEED = 0x243F6A8885A308D3
_MAX_HITS = 255
# The n-gram orders a pool indexes: every short one, then sparser long ones.
_ORDER_LADDER = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
# A draft that returns to the state (last tokens) it drafted from is going round a cycle.
_CYCLE_STATE = 4


def orders_up_to(n_match: int) -> tuple[int, ...]:
    """The indexed orders up to ``n_match`` (``n_match`` itself included)."""
    return tuple(sorted({n for n in _ORDER_LADDER if n < n_match} | {n_match}))


def suffix_keys(tokens: Sequence[int], end: int, orders: Sequence[int]) -> list[int]:
    """Keys of ``tokens[end - n:end]`` for each ``n`` in ``orders`` (ascending) that fits before
    ``end``, in one backwards pass.

    The hash folds tokens from the most recent backwards, so the key of each longer n-gram
    extends the shorter one's. Keys are never 0 (0 marks an empty slot).
    """
    keys: list[int] = []
    h = _SEED
    n = 0
    for order in orders:
        if order > end:
            break
        while n < order:
            n += 1
            h = ((h ^ (tokens[end - n] + 1)) * _MULTIPLIER) & _MASK64
        key = h ^ (h >> 31)
        keys.append(key or 1)
    return keys


def hash_fingerprint() -> int:
    """The key of a fixed 16-gram: two pools agree on keys only if they agree on this."""
    return suffix_keys(range(1, 17), 16, (16,))[0]


class IndexedSequence:
    """One sequence whose first ``indexed`` tokens are in the table.

    ``tokens`` remembers them for prefix matching (only the first ``max_sequence_tokens``).
    """

    __slots__ = ("indexed", "tokens")

    def __init__(self, tokens: Sequence[int], indexed: int) -> None:
        self.tokens = array("i", tokens)
        self.indexed = indexed


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix, comparing in C-speed slices before element-wise."""
    limit = min(len(a), len(b))
    lo, step = 0, 256
    while lo < limit:
        hi = min(lo + step, limit)
        if list(a[lo:hi]) != list(b[lo:hi]):
            break
        lo = hi
    else:
        return limit
    while lo < limit and a[lo] == b[lo]:
        lo += 1
    return lo


class NgramPool:
    """A bounded hash table from n-gram to next token, shared by the drafters of one model.

    ``capacity`` (a power of two) fixes the memory; ``n_match`` is the longest n-gram indexed
    (``orders`` are those indexed).
    ``writes`` counts table writes (for tests and statistics). Writers need no lock: a racing
    write can only store a wrong guess, which verification rejects.
    """

    def __init__(
        self,
        n_match: int = 16,
        *,
        capacity: int = 1 << 20,
        max_sequences: int = 8,
        max_sequence_tokens: int = 1 << 17,
    ) -> None:
        if n_match < 1:
            raise ValueError("n_match must be at least 1")
        if capacity < 2 or capacity & (capacity - 1):
            raise ValueError("capacity must be a power of two (at least 2)")
        self.n_match = n_match
        self.orders = orders_up_to(n_match)
        self.capacity = capacity
        self.max_sequences = max_sequences
        self.max_sequence_tokens = max_sequence_tokens
        self._shift = 64 - (capacity.bit_length() - 1)  # slot = the key's top bits
        self._keys = array("Q", bytes(8 * capacity))
        self._next = array("i", bytes(4 * capacity))
        self._hits = array("B", bytes(capacity))
        self._sequences: list[IndexedSequence] = []  # most recently used last
        self._lock = threading.Lock()
        self.writes = 0

    @property
    def nbytes(self) -> int:
        """Memory held by the table and the prefix memory (the bound is documented above)."""
        tables = (self._keys, self._next, self._hits)
        table_bytes = sum(t.itemsize * len(t) for t in tables)
        return table_bytes + sum(s.tokens.itemsize * len(s.tokens) for s in self._sequences)

    def clear(self) -> None:
        with self._lock:
            for table in (self._keys, self._next, self._hits):
                table[:] = array(table.typecode, bytes(table.itemsize * len(table)))
            self._sequences.clear()

    # --- the table ---

    def lookup(self, key: int) -> tuple[int, int] | None:
        """``(next_token, hits)`` stored for ``key``, or None."""
        slot = key >> self._shift
        if self._keys[slot] != key:
            return None
        return self._next[slot], self._hits[slot]

    def _write(self, key: int, token: int) -> None:
        slot = key >> self._shift
        self.writes += 1
        if self._keys[slot] == key and self._next[slot] == token:
            if self._hits[slot] < _MAX_HITS:
                self._hits[slot] += 1
            return
        self._keys[slot] = key
        self._next[slot] = token
        self._hits[slot] = 1

    def _index_range(self, tokens: Sequence[int], start: int, stop: int) -> None:
        """Record, for each position in [start, stop), the n-grams before it -> its token."""
        orders = self.orders
        for i in range(max(start, 1), stop):
            token = tokens[i]
            for key in suffix_keys(tokens, i, orders):
                self._write(key, token)

    # --- persistence ---

    def save(self, path: Path, *, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        """Write the table to ``path`` (atomically: temp file, fsync, rename), in at most
        ``max_bytes`` bytes. Raises OSError when the file cannot be written (nothing is left
        half-written); the pool is unchanged either way."""
        entries = self._entries_to_keep(max_entries(max_bytes))
        write_atomic(path, encode(entries, n_match=self.n_match, fingerprint=hash_fingerprint()))

    @classmethod
    def load(
        cls,
        path: Path,
        n_match: int = 16,
        *,
        capacity: int = 1 << 20,
        max_sequences: int = 8,
        max_sequence_tokens: int = 1 << 17,
    ) -> NgramPool:
        """A pool (built with these arguments, as ``NgramPool(...)``) holding what ``path``
        saved. A missing, truncated, corrupt or other-version file gives an empty pool and a
        logged line, never an exception: the pool only ever speeds drafting up."""
        pool = cls(
            n_match,
            capacity=capacity,
            max_sequences=max_sequences,
            max_sequence_tokens=max_sequence_tokens,
        )
        entries = read_entries(path, fingerprint=hash_fingerprint())
        if entries is not None and len(entries):
            pool._insert(entries)
        return pool

    def _entries_to_keep(self, limit: int) -> NgramEntries:
        with self._lock:
            keys = np.frombuffer(self._keys, dtype=np.uint64).copy()
            tokens = np.frombuffer(self._next, dtype=np.int32).copy()
            hits = np.frombuffer(self._hits, dtype=np.uint8).copy()
            recent = [array("i", seq.tokens) for seq in reversed(self._sequences)]
        table = NgramEntries(keys, tokens, hits)
        return select_entries(table, self._recent_keys(recent), self._shift, limit)

    def _recent_keys(self, sequences: list[array[int]]) -> Iterator[int]:
        """Keys of the n-grams of ``sequences`` (newest first), each from its end backwards."""
        for tokens in sequences:
            for end in range(len(tokens) - 1, 0, -1):
                yield from suffix_keys(tokens, end, self.orders)

    def _insert(self, entries: NgramEntries) -> None:
        slots, chosen = slots_for(entries, self._shift)
        with self._lock:
            np.frombuffer(self._keys, dtype=np.uint64)[slots] = entries.keys[chosen]
            np.frombuffer(self._next, dtype=np.int32)[slots] = entries.tokens[chosen]
            np.frombuffer(self._hits, dtype=np.uint8)[slots] = entries.hits[chosen]

    # --- sequences ---

    def open_sequence(self, tokens: Sequence[int]) -> IndexedSequence:
        """Start tracking a sequence: index what the pool has not seen of ``tokens``.

        The longest prefix shared with a remembered sequence is already in the table, so only
        the rest costs writes.
        """
        with self._lock:
            best, best_len = None, 0
            for seq in self._sequences:
                length = common_prefix_length(seq.tokens, tokens)
                if length > best_len:
                    best, best_len = seq, length
            if best is not None and best_len == len(best.tokens):
                self._sequences.remove(best)  # the new sequence extends it: replace it
            seq = IndexedSequence(tokens[: min(best_len, self.max_sequence_tokens)], best_len)
            self._sequences.append(seq)
            del self._sequences[: -self.max_sequences]
        self.extend(seq, tokens)
        return seq

    def extend(self, seq: IndexedSequence, tokens: Sequence[int]) -> None:
        """``tokens`` is the sequence now: index the positions that are new to the pool."""
        done = seq.indexed
        recorded = len(seq.tokens)
        if done > len(tokens) or (recorded and tokens[recorded - 1] != seq.tokens[-1]):
            # Not the usual append-only growth (a caller rewound the sequence): resynchronise.
            done = common_prefix_length(seq.tokens, tokens)
            del seq.tokens[done:]
        self._index_range(tokens, done, len(tokens))
        seq.indexed = len(tokens)
        room = self.max_sequence_tokens - len(seq.tokens)
        if room > 0 and len(seq.tokens) < len(tokens):
            seq.tokens.extend(tokens[len(seq.tokens) : len(seq.tokens) + room])


class NgramDrafter:
    """Drafts by following the pool's n-gram -> next-token chain from the current suffix.

    At each step the longest indexed n-gram (``n_match`` down to 1) with an entry wins; a 1-gram
    needs ``unigram_min_hits`` consecutive sightings of the same follower, since single tokens
    are weak evidence. The chain stops when no n-gram has an entry, or when it comes back to a
    state (its last 4 tokens) it already drafted from, unless the context itself already ends in
    that cycle twice (then the repetition is the best guess). A draft shorter than ``n_min`` is
    dropped.

    Each drafted token carries an acceptance estimate learned per n-gram order (a token that a
    4-gram predicted is right far more often than one a single token predicted), so the engine
    verifies only as much of the chain as is likely to pay.
    """

    kind = "ngram"

    def __init__(
        self,
        n_match: int | None = None,
        n_min: int = 1,
        pool: NgramPool | None = None,
        *,
        unigram_min_hits: int = 2,
    ) -> None:
        if n_match is not None and (not isinstance(n_match, int) or isinstance(n_match, bool)):
            raise TypeError("n_match must be an int; pass a shared pool as pool=...")
        if pool is None:
            pool = NgramPool() if n_match is None else NgramPool(n_match)
        if n_match is None:
            n_match = pool.n_match
        if not 1 <= n_match <= pool.n_match:
            raise ValueError(f"n_match must be in 1..{pool.n_match} (the pool's n_match)")
        self.n_match = n_match
        self._orders = tuple(n for n in pool.orders if n <= n_match)
        self.n_min = max(1, n_min)
        self.pool = pool
        self.unigram_min_hits = unigram_min_hits
        # Starting estimates per order (0.1 for 1-grams, 0.7 for 4-grams, 0.85 for 16-grams);
        # learned from outcomes from then on.
        self.acceptance = AcceptanceByClass({n: 0.9 - 0.8 / n for n in self._orders})
        self._seq: IndexedSequence | None = None

    def begin(self, tokens: Sequence[int]) -> None:
        self.acceptance.forget()
        self._seq = self.pool.open_sequence(tokens)

    def commit(self, tokens: Sequence[int]) -> None:
        self.acceptance.judge(tokens)
        if self._seq is None:
            self._seq = self.pool.open_sequence(tokens)
        else:
            self.pool.extend(self._seq, tokens)

    def propose(
        self, tokens: Sequence[int], max_tokens: int, probs: ProbabilityFn | None = None
    ) -> Proposal:
        self.commit(tokens)  # index anything not committed yet (no-op in the usual loop)
        context = list(tokens[-(self.n_match + 1) :])
        draft: list[int] = []
        orders: list[int] = []
        seen = {tuple(context[-_CYCLE_STATE:]): 0}
        cycle_ok = False
        while len(draft) < max_tokens:
            found = self._next_token(context)
            if found is None:
                break
            token, order = found
            draft.append(token)
            orders.append(order)
            context.append(token)
            state = tuple(context[-_CYCLE_STATE:])
            if not cycle_ok and state in seen:
                period = len(draft) - seen[state]
                if not _ends_with_cycle_twice(tokens, draft, period):
                    break
                cycle_ok = True
            seen.setdefault(state, len(draft))
        if len(draft) < self.n_min:
            draft, orders = [], []
        return Proposal(draft, None, self.acceptance.expect(len(tokens), draft, orders))

    def _next_token(self, context: list[int]) -> tuple[int, int] | None:
        """The next token and the order of the n-gram that predicted it."""
        keys = suffix_keys(context, len(context), self._orders)
        for i in range(len(keys) - 1, -1, -1):
            n = self._orders[i]
            found = self.pool.lookup(keys[i])
            if found is not None and (n > 1 or found[1] >= self.unigram_min_hits):
                return found[0], n
        return None


def _ends_with_cycle_twice(tokens: Sequence[int], draft: list[int], period: int) -> bool:
    """True when the context's last 2*period tokens are the drafted cycle, twice."""
    if len(tokens) < 2 * period:
        return False
    cycle = draft[-period:]
    tail = list(tokens[-2 * period :])
    return tail[:period] == tail[period:] == cycle
