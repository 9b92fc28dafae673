#!/usr/bin/env python3
"""Writes the corpus's binary inputs (compressed logs, binary traces with a
valid checksum but a bad record) beside this script. Run it from anywhere;
the files are committed, so this only documents how they were made.

The binary trace layout and checksum are crates/trace/FORMAT.md's."""

import gzip
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
M64 = (1 << 64) - 1


def rotl(x, r):
    return ((x << r) | (x >> (64 - r))) & M64


def checksum(data: bytes) -> int:
    k = 0x9E3779B97F4A7C15
    h = [k ^ len(data), rotl(k, 17), rotl(k, 31), rotl(k, 47)]
    full = len(data) // 32 * 32
    stripes = [data[i:i + 32] for i in range(0, full, 32)]
    rem = data[full:]
    if rem:
        stripes.append(rem + bytes(32 - len(rem)))
    for s in stripes:
        for lane in range(4):
            (w,) = struct.unpack_from("<Q", s, lane * 8)
            h[lane] = rotl(((h[lane] ^ w) * 0xFF51AFD7ED558CCD) & M64, 31)
    x = h[0] ^ rotl(h[1], 7) ^ rotl(h[2], 13) ^ rotl(h[3], 29)
    x ^= x >> 33
    x = (x * 0xFF51AFD7ED558CCD) & M64
    x ^= x >> 33
    x = (x * 0xC4CEB9FE1A85EC53) & M64
    return x ^ (x >> 33)


def trace(payload: bytes, records: int) -> bytes:
    """A finalized version-1 trace at 4 KiB pages with one block."""
    bsum = checksum(payload)
    chain = checksum(struct.pack("<QQ", 0, bsum))
    head = b"MMUTRACE" + struct.pack("<HBBI", 1, 12, 1, 0)
    head += struct.pack("<QQQQQ", records, records, 0, 1, chain)
    head += struct.pack("<Q", checksum(head))
    block = struct.pack("<IIQ", len(payload), records, bsum) + payload
    return head + block


def varint(v: int) -> bytes:
    out = b""
    while v >= 0x80:
        out += bytes([v & 0x7F | 0x80])
        v >>= 7
    return out + bytes([v])


def write(name, data):
    with open(os.path.join(HERE, name), "wb") as f:
        f.write(data)


LOG = b"==1== Lackey\n L 1000,4\n S 2000,8\nI  400000,3\n"

# A short record whose delta (-1) takes the first page number below 0: it
# wrapped to 2^64-1 and was taken in.
write("trace-binary-negative-delta.mmutrace", trace(bytes([0x1F]), 1))
# A long record whose delta takes the page past the address space.
write("trace-binary-delta-past-top.mmutrace",
      trace(bytes([0xC0]) + varint((1 << 62) << 1), 1))
# The header's checksum broken.
t = bytearray(trace(bytes([0x01]), 1))
t[20] ^= 0xFF
write("trace-binary-bad-header-checksum.mmutrace", bytes(t))
# A block that claims more bytes than the file has.
write("trace-binary-cut-block.mmutrace", trace(bytes([0x01, 0x02, 0x03]), 3)[:-2])
# gzip magic, then garbage: it used to come back as binary garbage in the
# error message.
write("trace-gzip-garbage.log.gz", b"\x1f\x8b" + bytes(range(200)))
# A real gzip stream, cut in the middle.
write("trace-gzip-cut.log.gz", gzip.compress(LOG * 50, mtime=0)[:40])
# zstd magic, then garbage.
write("trace-zstd-garbage.log.zst", b"\x28\xb5\x2f\xfd" + bytes(range(255, 55, -1)))
# A gzip stream that holds nothing.
write("trace-gzip-empty.log.gz", gzip.compress(b"", mtime=0))
# A gzip stream of a lackey log with a malformed line: named by its line.
write("trace-gzip-bad-line.log.gz", gzip.compress(LOG + b" Q junk\n", mtime=0))
