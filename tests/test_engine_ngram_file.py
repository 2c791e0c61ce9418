"""The n-gram pool on disk: round trips, damaged files, the size bound (no model)."""

from __future__ import annotations

import logging
import random
import struct
from pathlib import Path

import numpy as np
import pytest

from modelhub.engine.speculative.ngram import IndexedSequence, NgramDrafter, NgramPool
from modelhub.engine.speculative.ngram_file import DEFAULT_MAX_BYTES, HEADER, VERSION


def tokens(n: int, seed: int, vocab: int = 49152) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(vocab) for _ in range(n)]


def sequence(seed: int, length: int) -> list[int]:
    """Random text with a phrase repeated in it (entries with several hits, 1-grams that draft)."""
    phrase = tokens(12, seed=99, vocab=50)
    return tokens(length, seed) + phrase * 3 + tokens(50, seed + 100)


def filled_pool(capacity: int = 1 << 14, n_sequences: int = 4, length: int = 600) -> NgramPool:
    pool = NgramPool(8, capacity=capacity)
    for seed in range(n_sequences):
        pool.open_sequence(sequence(seed, length))
    return pool


def table(pool: NgramPool) -> dict[int, tuple[int, int]]:
    keys = np.frombuffer(pool._keys, dtype=np.uint64)
    return {int(keys[slot]): (pool._next[slot], pool._hits[slot]) for slot in np.flatnonzero(keys)}


def drafts(pool: NgramPool, contexts: list[list[int]]) -> list[list[int]]:
    """What a drafter proposes after each context, looking the pool up without indexing."""
    out = []
    for context in contexts:
        drafter = NgramDrafter(pool=pool)
        drafter._seq = IndexedSequence(context, len(context))  # as if indexed: adds nothing
        out.append(list(drafter.propose(context, 8).tokens))
    return out


def contexts_from(seeds: range, length: int = 600) -> list[list[int]]:
    """Contexts ending inside material the pool has seen, and one it has not."""
    cut = [sequence(seed, length)[: 40 + 37 * seed] for seed in seeds]
    phrase_end = [sequence(seed, length)[: length + 15] for seed in seeds]
    return [*cut, *phrase_end, tokens(30, seed=12345)]


def test_a_round_trip_gives_the_same_table_and_the_same_drafts(tmp_path: Path) -> None:
    pool = filled_pool()
    path = tmp_path / "drafting" / "ab" / "ngram.pool"
    probes = contexts_from(range(4))
    before = drafts(pool, probes)
    assert sum(map(len, before)) > 20  # the probes do draft
    pool.save(path)
    assert [p.name for p in path.parent.iterdir()] == ["ngram.pool"]  # no temp file left
    loaded = NgramPool.load(path, 8, capacity=1 << 14)
    assert table(loaded) == table(pool)
    assert drafts(loaded, probes) == before
    # another capacity (slots are the keys' top bits) and n_match still draft the same
    assert drafts(NgramPool.load(path, 16, capacity=1 << 16), probes) == before
    # saving again replaces the file with the same bytes
    data = path.read_bytes()
    loaded.save(path)
    assert path.read_bytes() == data


def test_a_smaller_table_keeps_the_entry_with_more_hits_per_slot(tmp_path: Path) -> None:
    pool = filled_pool(capacity=1 << 12)
    pool.save(tmp_path / "pool")
    small = NgramPool.load(tmp_path / "pool", 8, capacity=1 << 6)
    kept = table(small)
    assert 0 < len(kept) <= 1 << 6
    original = table(pool)
    for key, (token, hits) in kept.items():
        assert original[key] == (token, hits)
        slot = key >> (64 - 6)
        rivals = [h for k, (_, h) in original.items() if k >> (64 - 6) == slot]
        assert hits == max(rivals)


def damaged_files(good: bytes) -> dict[str, bytes]:
    magic, version, n_match, fingerprint, count, crc = HEADER.unpack_from(good)
    payload = good[HEADER.size :]
    flipped = bytearray(good)
    flipped[HEADER.size + 5] ^= 0x40
    return {
        "empty": b"",
        "short header": good[:20],
        "truncated payload": good[:-7],
        "extra bytes": good + b"\0",
        "flipped payload byte": bytes(flipped),
        "wrong magic": b"GGUF" + good[4:],
        "other version": HEADER.pack(magic, VERSION + 1, n_match, fingerprint, count, crc)
        + payload,
        "other hash": HEADER.pack(magic, version, n_match, fingerprint ^ 1, count, crc) + payload,
        "count too large": HEADER.pack(magic, version, n_match, fingerprint, 1 << 30, crc)
        + payload,
        "text": b"not a pool at all\n" * 10,
    }


def test_a_damaged_or_foreign_file_gives_an_empty_pool_and_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    good_path = tmp_path / "good"
    filled_pool().save(good_path)
    good = good_path.read_bytes()
    for case, data in damaged_files(good).items():
        path = tmp_path / case.replace(" ", "-")
        path.write_bytes(data)
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="modelhub.engine"):
            pool = NgramPool.load(path, 8, capacity=1 << 14)
        assert table(pool) == {}, case
        (record,) = caplog.records
        assert record.levelno == logging.WARNING, case
        assert str(path) in record.getMessage() and "empty" in record.getMessage(), case
        # an empty pool still works, and the next save replaces the damaged file
        pool.open_sequence(tokens(100, seed=1))
        pool.save(path)
        assert table(NgramPool.load(path, 8, capacity=1 << 14)) == table(pool)


def test_a_missing_file_or_a_folder_in_its_place_gives_an_empty_pool(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="modelhub.engine"):
        assert table(NgramPool.load(tmp_path / "never-saved")) == {}
        (tmp_path / "a-folder").mkdir()
        assert table(NgramPool.load(tmp_path / "a-folder")) == {}
    missing, folder = caplog.records
    assert missing.levelno == logging.INFO and "no saved n-gram pool" in missing.getMessage()
    assert folder.levelno == logging.WARNING


def test_the_file_stays_within_its_bound_and_keeps_the_latest_material(tmp_path: Path) -> None:
    pool = filled_pool(capacity=1 << 14, n_sequences=6, length=1500)
    assert len(table(pool)) > 4000
    latest = sequence(5, 1500)  # the sequence opened last
    path = tmp_path / "pool"
    bound = HEADER.size + 13 * 2000
    pool.save(path, max_bytes=bound + 12)  # room for 2,000 entries and 12 spare bytes
    assert path.stat().st_size == bound
    loaded = NgramPool.load(path, 8, capacity=1 << 14)
    kept, original = table(loaded), table(pool)
    assert len(kept) == 2000 and all(original[k] == v for k, v in kept.items())
    # the end of the latest sequence is still drafted from the saved pool
    probe = latest[:-20]
    assert drafts(loaded, [probe]) == drafts(pool, [probe]) != [[]]
    # the most frequent entries are kept too
    assert max(hits for _, hits in kept.values()) == max(hits for _, hits in original.values())
    with pytest.raises(ValueError, match="at least 32"):
        pool.save(path, max_bytes=10)


def test_a_full_default_pool_saves_in_at_most_four_mib(tmp_path: Path) -> None:
    pool = NgramPool()
    pool.open_sequence(tokens(60_000, seed=3))  # ~370,000 entries: more than the bound holds
    path = tmp_path / "pool"
    pool.save(path)
    assert DEFAULT_MAX_BYTES - 13 < path.stat().st_size <= DEFAULT_MAX_BYTES == 4 << 20


def test_a_failed_save_raises_and_leaves_nothing(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("x")
    with pytest.raises(OSError):
        filled_pool().save(blocker / "pool")
    assert blocker.read_text() == "x"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["not-a-folder"]


def test_the_header_is_the_documented_32_bytes() -> None:
    assert HEADER.size == 32
    assert struct.calcsize("<8sIIQII") == 32
