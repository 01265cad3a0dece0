"""Decode the first bytes of a Zstandard frame, in pure Python (RFC 8878).

Compressed HIP offload bundles (ROCm 6.2+, clang ``--offload-compress``) keep their entry table
(the target triples) at the start of a zstd frame, and the images' Python usually has neither
``compression.zstd`` (3.14+) nor ``zstandard``. To read the table only the first kilobytes of
output are needed: this decoder stops as soon as it has produced ``limit`` bytes, decoding only
the literals and sequences that reach them. Single frame, no dictionary, checksum not verified.
The tests check it against the ``zstandard`` module on data compressed at several levels.
"""

from __future__ import annotations

from dataclasses import dataclass


class ZstdError(Exception):
    """Not a zstd frame this decoder can read, or corrupt data."""


ZSTD_MAGIC = 0xFD2FB528

# RFC 8878 3.1.1.3.2.1: predefined distributions and the code tables.
LL_DEFAULT = (4, 3, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 2, 3, 2, 1,
              1, 1, 1, 1, -1, -1, -1, -1), 6
ML_DEFAULT = (1, 4, 3, 2, 2, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
              1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, -1, -1, -1, -1, -1, -1, -1), 6
OF_DEFAULT = (1, 1, 1, 1, 1, 1, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, -1, -1,
              -1, -1, -1), 5
LL_BASE = tuple(range(16)) + (16, 18, 20, 22, 24, 28, 32, 40, 48, 64, 128, 256, 512, 1024, 2048,
                              4096, 8192, 16384, 32768, 65536)
LL_BITS = (0,) * 16 + (1, 1, 1, 1, 2, 2, 3, 3, 4, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16)
ML_BASE = tuple(range(3, 35)) + (35, 37, 39, 41, 43, 47, 51, 59, 67, 83, 99, 131, 259, 515, 1027,
                                 2051, 4099, 8195, 16387, 32771, 65539)
ML_BITS = (0,) * 32 + (1, 1, 1, 1, 2, 2, 3, 3, 4, 4, 5, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16)


class Forward:
    """Little-endian bit reader, least significant bit first (FSE table descriptions)."""

    def __init__(self, data: bytes, pos: int = 0) -> None:
        self.data, self.bit = data, pos * 8

    def read(self, n: int) -> int:
        start, end = self.bit >> 3, (self.bit + n + 7) >> 3
        if end > len(self.data):
            raise ZstdError("FSE table description runs past its block")
        v = (int.from_bytes(self.data[start:end], "little") >> (self.bit & 7)) & ((1 << n) - 1)
        self.bit += n
        return v

    def byte_pos(self) -> int:
        """Position of the next whole byte (the stream is aligned after a table)."""
        return (self.bit + 7) >> 3


class Backward:
    """The reverse bit stream of Huffman and FSE payloads: read from the end, most significant
    bits first; the last byte's highest set bit marks the start. Reading past the beginning
    yields zeros (``bits`` goes negative)."""

    def __init__(self, data: bytes) -> None:
        if not data or data[-1] == 0:
            raise ZstdError("bit stream without its end mark")
        self.data = data
        self.bits = (len(data) - 1) * 8 + data[-1].bit_length() - 1

    def peek(self, n: int) -> int:
        lo = self.bits - n
        if lo >= 0:
            v = int.from_bytes(self.data[lo >> 3:(self.bits + 7) >> 3], "little") >> (lo & 7)
            return v & ((1 << n) - 1)
        if self.bits <= 0:
            return 0
        v = int.from_bytes(self.data[:(self.bits + 7) >> 3], "little") & ((1 << self.bits) - 1)
        return v << -lo

    def read(self, n: int) -> int:
        if n == 0:
            return 0
        v = self.peek(n)
        self.bits -= n
        return v


@dataclass
class Fse:
    """An FSE decoding table."""

    log: int
    symbol: list[int]
    nbits: list[int]
    base: list[int]


def fse_table(probs: list[int] | tuple[int, ...], log: int) -> Fse:
    """RFC 8878 4.1.1: spread the symbols over 2^log states."""
    size = 1 << log
    symbol = [0] * size
    high = size
    desc = [0] * len(probs)
    for s, p in enumerate(probs):
        if p == -1:
            high -= 1
            symbol[high] = s
            desc[s] = 1
    step, mask, pos = (size >> 1) + (size >> 3) + 3, size - 1, 0
    for s, p in enumerate(probs):
        if p <= 0:
            continue
        desc[s] = p
        for _ in range(p):
            symbol[pos] = s
            pos = (pos + step) & mask
            while pos >= high:
                pos = (pos + step) & mask
    if pos != 0:
        raise ZstdError("FSE distribution does not fill its table")
    nbits, base = [0] * size, [0] * size
    for i in range(size):
        d = desc[symbol[i]]
        desc[symbol[i]] += 1
        nbits[i] = log - (d.bit_length() - 1)
        base[i] = (d << nbits[i]) - size
    return Fse(log, symbol, nbits, base)


def read_fse(data: bytes, pos: int, max_log: int, max_symbol: int) -> tuple[Fse, int]:
    """An FSE table description at ``data[pos:]``: the table and the position after it."""
    r = Forward(data, pos)
    log = r.read(4) + 5
    if log > max_log:
        raise ZstdError(f"FSE accuracy {log} above {max_log}")
    remaining = 1 << log
    probs: list[int] = []
    while remaining > 0 and len(probs) <= max_symbol:
        bits = (remaining + 1).bit_length()
        val = r.read(bits)
        low_mask = (1 << (bits - 1)) - 1
        threshold = (1 << bits) - 1 - (remaining + 1)
        if val & low_mask < threshold:
            r.bit -= 1
            val &= low_mask
        elif val > low_mask:
            val -= threshold
        p = val - 1
        remaining -= abs(p)
        probs.append(p)
        if p == 0:
            while True:
                rep = r.read(2)
                probs += [0] * rep
                if rep != 3:
                    break
    if remaining != 0 or len(probs) > max_symbol + 1:
        raise ZstdError("corrupt FSE distribution")
    return fse_table(probs, log), r.byte_pos()


@dataclass
class Huffman:
    maxbits: int
    symbol: list[int]
    nbits: list[int]


def huffman_from_weights(weights: list[int]) -> Huffman:
    """RFC 8878 4.2.1: the last weight is implied; codes are distributed from the lowest
    weight up, symbols of one weight in their natural order."""
    total = sum(1 << (w - 1) for w in weights if w)
    if total == 0:
        raise ZstdError("empty Huffman tree")
    maxbits = total.bit_length()
    left = (1 << maxbits) - total
    if left & (left - 1):
        raise ZstdError("Huffman weights do not sum to a power of two")
    weights = weights + [left.bit_length()]
    if maxbits > 11:
        raise ZstdError(f"Huffman depth {maxbits} above 11")
    bits = [maxbits + 1 - w if w else 0 for w in weights]
    count = [0] * (maxbits + 2)
    for b in bits:
        if b:
            count[b] += 1
    rank = [0] * (maxbits + 2)
    for b in range(maxbits, 0, -1):
        rank[b - 1] = rank[b] + count[b] * (1 << (maxbits - b))
    size = 1 << maxbits
    symbol, nbits = [0] * size, [0] * size
    for s, b in enumerate(bits):
        if b:
            n = 1 << (maxbits - b)
            at = rank[b]
            symbol[at:at + n] = [s] * n
            nbits[at:at + n] = [b] * n
            rank[b] += n
    return Huffman(maxbits, symbol, nbits)


def read_huffman(data: bytes, pos: int) -> tuple[Huffman, int]:
    """A Huffman tree description at ``data[pos]``: the table and the position after it."""
    head = data[pos]
    if head >= 128:
        n = head - 127
        raw = data[pos + 1:pos + 1 + (n + 1) // 2]
        direct = [(raw[i // 2] >> (0 if i % 2 else 4)) & 15 for i in range(n)]
        return huffman_from_weights(direct), pos + 1 + (n + 1) // 2
    end = pos + 1 + head
    table, start = read_fse(data[:end], pos + 1, 6, 255)
    stream = Backward(data[start:end])
    s1, s2 = stream.read(table.log), stream.read(table.log)
    weights: list[int] = []
    while len(weights) < 255:
        weights.append(table.symbol[s1])
        s1 = table.base[s1] + stream.read(table.nbits[s1])
        if stream.bits < 0:
            weights.append(table.symbol[s2])
            break
        weights.append(table.symbol[s2])
        s2 = table.base[s2] + stream.read(table.nbits[s2])
        if stream.bits < 0:
            weights.append(table.symbol[s1])
            break
    return huffman_from_weights(weights), end


def huffman_decode(table: Huffman, data: bytes, count: int) -> bytes:
    """The first ``count`` symbols of one Huffman stream."""
    stream = Backward(data)
    out = bytearray()
    sym, nb, mb = table.symbol, table.nbits, table.maxbits
    for _ in range(count):
        v = stream.peek(mb)
        out.append(sym[v])
        stream.bits -= nb[v]
    if stream.bits < 0:
        raise ZstdError("Huffman stream overrun")
    return bytes(out)


@dataclass
class State:
    """What carries from one block to the next."""

    huffman: Huffman | None = None
    ll: Fse | None = None
    of: Fse | None = None
    ml: Fse | None = None
    reps: tuple[int, int, int] = (1, 4, 8)


def literals(block: bytes, st: State, need: int) -> tuple[bytes, int, int]:
    """(the first ``need`` literals or all of them, their full count, position after)."""
    b0 = block[0]
    kind, fmt = b0 & 3, (b0 >> 2) & 3
    if kind in (0, 1):
        if fmt in (0, 2):
            size, h = b0 >> 3, 1
        elif fmt == 1:
            size, h = (b0 >> 4) + (block[1] << 4), 2
        else:
            size, h = (b0 >> 4) + (block[1] << 4) + (block[2] << 12), 3
        if kind == 0:
            return block[h:h + min(size, need)], size, h + size
        return block[h:h + 1] * min(size, need), size, h + 1
    hsize, width, streams = {0: (3, 10, 1), 1: (3, 10, 4), 2: (4, 14, 4), 3: (5, 18, 4)}[fmt]
    head = int.from_bytes(block[:hsize], "little") >> 4
    size, csize = head & ((1 << width) - 1), head >> width
    pos, end = hsize, hsize + csize
    if kind == 2:
        st.huffman, pos = read_huffman(block[:end], pos)
    if st.huffman is None:
        raise ZstdError("treeless literals without a previous Huffman table")
    if streams == 1:
        return huffman_decode(st.huffman, block[pos:end], min(size, need)), size, end
    s1, s2, s3 = (int.from_bytes(block[pos + i:pos + i + 2], "little") for i in (0, 2, 4))
    bounds = [pos + 6, pos + 6 + s1, pos + 6 + s1 + s2, pos + 6 + s1 + s2 + s3, end]
    seg = (size + 3) // 4
    out = b""
    for i in range(4):
        count = seg if i < 3 else size - 3 * seg
        want = min(count, need - len(out))
        if want <= 0:
            break
        out += huffman_decode(st.huffman, block[bounds[i]:bounds[i + 1]], want)
    return out, size, end


def _table(block: bytes, pos: int, mode: int, default: tuple[tuple[int, ...], int],
           previous: Fse | None, max_log: int, max_symbol: int) -> tuple[Fse, int]:
    if mode == 0:
        return fse_table(*default), pos
    if mode == 1:
        return Fse(0, [block[pos]], [0], [0]), pos + 1
    if mode == 2:
        return read_fse(block, pos, max_log, max_symbol)
    if previous is None:
        raise ZstdError("repeat mode without a previous table")
    return previous, pos


def block_prefix(block: bytes, st: State, out: bytearray, limit: int) -> None:
    """Decode a compressed block onto ``out``, stopping once ``out`` holds ``limit`` bytes."""
    lits, total, pos = literals(block, st, limit - len(out))
    b0 = block[pos]
    if b0 == 0:
        out += lits
        return
    if b0 < 128:
        nseq, pos = b0, pos + 1
    elif b0 < 255:
        nseq, pos = ((b0 - 128) << 8) + block[pos + 1], pos + 2
    else:
        nseq, pos = block[pos + 1] + (block[pos + 2] << 8) + 0x7F00, pos + 3
    modes = block[pos]
    pos += 1
    st.ll, pos = _table(block, pos, modes >> 6, LL_DEFAULT, st.ll, 9, 35)
    st.of, pos = _table(block, pos, (modes >> 4) & 3, OF_DEFAULT, st.of, 8, 31)
    st.ml, pos = _table(block, pos, (modes >> 2) & 3, ML_DEFAULT, st.ml, 9, 52)
    ll_t, of_t, ml_t = st.ll, st.of, st.ml
    stream = Backward(block[pos:])
    ls, os_, ms = stream.read(ll_t.log), stream.read(of_t.log), stream.read(ml_t.log)
    r1, r2, r3 = st.reps
    lp = 0
    for i in range(nseq):
        ofc, llc, mlc = of_t.symbol[os_], ll_t.symbol[ls], ml_t.symbol[ms]
        ofv = (1 << ofc) + stream.read(ofc)
        ml = ML_BASE[mlc] + stream.read(ML_BITS[mlc])
        ll = LL_BASE[llc] + stream.read(LL_BITS[llc])
        if ofv > 3:
            off = ofv - 3
            r1, r2, r3 = off, r1, r2
        else:
            idx = ofv - 1 + (1 if ll == 0 else 0)
            if idx == 0:
                off = r1
            elif idx == 1:
                off = r2
                r1, r2 = r2, r1
            elif idx == 2:
                off = r3
                r1, r2, r3 = r3, r1, r2
            else:
                off = r1 - 1
                r1, r2, r3 = off, r1, r2
        out += lits[lp:lp + ll]
        lp += ll
        if len(out) >= limit:
            return
        if off > len(out) or off == 0:
            raise ZstdError("match offset before the start of the output")
        start = len(out) - off
        while ml > 0:
            piece = out[start:start + min(ml, off)]
            out += piece
            start += len(piece)
            ml -= len(piece)
        if len(out) >= limit:
            return
        if i + 1 < nseq:
            ls = ll_t.base[ls] + stream.read(ll_t.nbits[ls])
            ms = ml_t.base[ms] + stream.read(ml_t.nbits[ms])
            os_ = of_t.base[os_] + stream.read(of_t.nbits[os_])
    st.reps = (r1, r2, r3)
    if lp < total:
        out += lits[lp:]


def decompress_prefix(data: bytes, limit: int) -> bytes:
    """The first ``limit`` bytes of the zstd frame at the start of ``data`` (fewer if the frame
    is shorter)."""
    if len(data) < 6 or int.from_bytes(data[:4], "little") != ZSTD_MAGIC:
        raise ZstdError("not a zstd frame")
    fhd = data[4]
    single, dict_flag, fcs_flag = (fhd >> 5) & 1, fhd & 3, fhd >> 6
    pos = 5 + (0 if single else 1)
    dict_size = (0, 1, 2, 4)[dict_flag]
    if dict_size and int.from_bytes(data[pos:pos + dict_size], "little"):
        raise ZstdError("zstd frame needs a dictionary")
    pos += dict_size + ((1 if single else 0), 2, 4, 8)[fcs_flag]
    out = bytearray()
    st = State()
    while len(out) < limit:
        if pos + 3 > len(data):
            raise ZstdError("zstd frame truncated")
        head = int.from_bytes(data[pos:pos + 3], "little")
        last, kind, size = head & 1, (head >> 1) & 3, head >> 3
        pos += 3
        if kind == 0:
            out += data[pos:pos + size]
            pos += size
        elif kind == 1:
            out += data[pos:pos + 1] * size
            pos += 1
        elif kind == 2:
            if pos + size > len(data):
                raise ZstdError("zstd block truncated")
            block_prefix(data[pos:pos + size], st, out, limit)
            pos += size
        else:
            raise ZstdError("reserved zstd block type")
        if last:
            break
    return bytes(out[:limit])
