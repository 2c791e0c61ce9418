"""Model-free drafting from n-grams already seen (prompt, output, and earlier requests).

An :class:`NgramPool` maps the hash of ``n`` consecutive tokens to the token that followed them
most recently, for every ``n`` in ``1..n_match``. It is filled incrementally: each token that
enters a sequence costs ``n_match`` table writes, and a prompt that starts like a sequence the
pool has already indexed (a chat that grows turn by turn, a repeated system prompt) is indexed
only from where it differs. One pool per loaded model lets a request draft from what earlier
requests produced.

:class:`NgramDrafter` drafts by following the chain: look up the longest suffix of the
sequence that has an entry, append the stored token, repeat.

Memory is bounded: the table has a fixed number of slots (``capacity``, 13 bytes each; 2^20 slots
= 13.6 MB by default) and a colliding write replaces the older entry, so old material fades
instead of growing the table. The prefix memory keeps at most ``max_sequences`` sequences of at
most ``max_sequence_tokens`` tokens each (4 bytes a token; 8 x 2^17 tokens = 4 MB).
"""

from __future__ import annotations

import threading
from array import array
from collections.abc import Sequence

from modelhub.engine.speculative.base import ProbabilityFn, Proposal

_MASK64 = (1 << 64) - 1
_MULTIPLIER = 0x9E3779B97F4A7C15  # odd 64-bit constant (golden ratio): a good multiplicative hash
_SEED = 0x243F6A8885A308D3
_MAX_HITS = 255


def suffix_keys(tokens: Sequence[int], end: int, n_max: int) -> list[int]:
    """Keys of ``tokens[end - n:end]`` for ``n = 1..min(n_max, end)``, in one backwards pass.

    The hash folds tokens from the most recent backwards, so the key of each longer n-gram
    extends the shorter one's. Keys are never 0 (0 marks an empty slot).
    """
    keys: list[int] = []
    h = _SEED
    for n in range(1, min(n_max, end) + 1):
        h = ((h ^ (tokens[end - n] + 1)) * _MULTIPLIER) & _MASK64
        key = h ^ (h >> 31)
        keys.append(key or 1)
    return keys


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

    ``capacity`` (a power of two) fixes the memory; ``n_match`` is the longest n-gram indexed.
    ``writes`` counts table writes (for tests and statistics). Writers need no lock: a racing
    write can only store a wrong guess, which verification rejects.
    """

    def __init__(
        self,
        n_match: int = 4,
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
        n_match = self.n_match
        for i in range(max(start, 1), stop):
            token = tokens[i]
            for key in suffix_keys(tokens, i, n_match):
                self._write(key, token)

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

    At each step the longest n-gram (``n_match`` down to 1) with an entry wins; a 1-gram needs
    ``unigram_min_hits`` consecutive sightings of the same follower, since single tokens are
    weak evidence. The chain stops when no n-gram has an entry, or when it loops back to a state
    it already drafted from, unless the context itself already ends in that cycle twice (then
    the repetition is the best guess). A draft shorter than ``n_min`` is dropped.
    """

    kind = "ngram"

    def __init__(
        self,
        n_match: int = 4,
        n_min: int = 1,
        pool: NgramPool | None = None,
        *,
        unigram_min_hits: int = 2,
    ) -> None:
        if not isinstance(n_match, int) or isinstance(n_match, bool):
            raise TypeError("n_match must be an int; pass a shared pool as pool=...")
        if pool is None:
            pool = NgramPool(n_match)
        if not 1 <= n_match <= pool.n_match:
            raise ValueError(f"n_match must be in 1..{pool.n_match} (the pool's n_match)")
        self.n_match = n_match
        self.n_min = max(1, n_min)
        self.pool = pool
        self.unigram_min_hits = unigram_min_hits
        self._seq: IndexedSequence | None = None

    def begin(self, tokens: Sequence[int]) -> None:
        self._seq = self.pool.open_sequence(tokens)

    def commit(self, tokens: Sequence[int]) -> None:
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
        seen = {tuple(context[-self.n_match :]): 0}
        cycle_ok = False
        while len(draft) < max_tokens:
            token = self._next_token(context)
            if token is None:
                break
            draft.append(token)
            context.append(token)
            state = tuple(context[-self.n_match :])
            if not cycle_ok and state in seen:
                period = len(draft) - seen[state]
                if not _ends_with_cycle_twice(tokens, draft, period):
                    break
                cycle_ok = True
            seen.setdefault(state, len(draft))
        if len(draft) < self.n_min:
            draft = []
        return Proposal(draft, None)

    def _next_token(self, context: list[int]) -> int | None:
        keys = suffix_keys(context, len(context), self.n_match)
        for n in range(len(keys), 0, -1):
            found = self.pool.lookup(keys[n - 1])
            if found is not None and (n > 1 or found[1] >= self.unigram_min_hits):
                return found[0]
        return None


def _ends_with_cycle_twice(tokens: Sequence[int], draft: list[int], period: int) -> bool:
    """True when the context's last 2*period tokens are the drafted cycle, twice."""
    if len(tokens) < 2 * period:
        return False
    cycle = draft[-period:]
    tail = list(tokens[-2 * period :])
    return tail[:period] == tail[period:] == cycle
