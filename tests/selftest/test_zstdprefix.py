"""The pure-Python zstd prefix decoder against the ``zstandard`` module (the test extra), on
data compressed at several levels, whole and cut short."""

from __future__ import annotations

import random

import pytest

from builder.selftest.elf.zstdprefix import ZstdError, decompress_prefix

zstandard = pytest.importorskip("zstandard", reason="the test extra installs zstandard")


def sample(rng: random.Random, n: int) -> bytes:
    """Text-like runs, random bytes and byte runs: literals, matches, repeats and RLE."""
    words = [bytes(rng.choice(b"abcdefghijklmnop") for _ in range(rng.randint(2, 9)))
             for _ in range(300)]
    parts: list[bytes] = []
    size = 0
    while size < n:
        r = rng.random()
        part = (rng.choice(words) + b" " if r < 0.6 else
                rng.randbytes(rng.randint(1, 20)) if r < 0.8 else
                bytes([rng.randint(0, 3)]) * rng.randint(1, 50))
        parts.append(part)
        size += len(part)
    return b"".join(parts)[:n]


@pytest.mark.parametrize("n", [1, 100, 5000, 300_000])
@pytest.mark.parametrize("level", [-5, 1, 3, 9, 19])
def test_matches_zstandard(n: int, level: int) -> None:
    data = sample(random.Random(n * 100 + level), n)
    frame = zstandard.ZstdCompressor(level=level).compress(data)
    assert decompress_prefix(frame, len(data) + 10) == data
    for limit in (1, 64, 4096):
        assert decompress_prefix(frame, limit) == data[:limit]


def test_refuses_what_it_cannot_read() -> None:
    with pytest.raises(ZstdError, match="not a zstd frame"):
        decompress_prefix(b"CCOB\0\0\0\0", 10)
    frame = zstandard.ZstdCompressor(level=3).compress(b"abc" * 1000)
    with pytest.raises(ZstdError):
        decompress_prefix(frame[:-40], 10**6)
