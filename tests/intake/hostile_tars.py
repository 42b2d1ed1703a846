"""Tarballs that declare more than they send: header blocks written by hand, their declared data streamed
into the compressor a megabyte of zeros at a time, so the test never holds what they declare."""

from __future__ import annotations

import bz2
import lzma
import zlib
from collections.abc import Callable, Iterator

from tests.intake.contrib_example import MANIFEST_TEXT

BLOCK = 512


def header(name: bytes, size: int, typeflag: bytes) -> bytes:
    """A ustar header block: ``name``, ``size`` bytes of data to follow, of type ``typeflag``."""
    h = bytearray(BLOCK)
    h[0:len(name)] = name
    h[100:108] = b"0000644\x00"
    h[108:116] = b"0000000\x00"
    h[116:124] = b"0000000\x00"
    h[124:136] = b"%011o\x00" % size
    h[136:148] = b"%011o\x00" % 0
    h[148:156] = b" " * 8
    h[156:157] = typeflag
    h[257:263] = b"ustar\x00"
    h[263:265] = b"00"
    h[148:156] = b"%06o\x00 " % sum(h)
    return bytes(h)


def _padded(data: bytes) -> bytes:
    return data + bytes(-len(data) % BLOCK)


def _stream(declared: int, typeflag: bytes) -> Iterator[bytes]:
    """A tar stream: a header of ``typeflag`` declaring ``declared`` bytes (zeros), then a plain manifest."""
    yield header(b"././@LongLink" if typeflag in b"LK" else b"pax", declared, typeflag)
    chunk = bytes(1 << 20)
    left = declared
    while left:
        step = min(left, len(chunk))
        yield chunk[:step]
        left -= step
    yield bytes(-declared % BLOCK)
    manifest = MANIFEST_TEXT.encode()
    yield header(b"farm-env.toml", len(manifest), b"0") + _padded(manifest)
    yield bytes(2 * BLOCK)


def compressed(parts: Iterator[bytes], kind: str) -> bytes:
    make: Callable[[], object] = {"gz": lambda: zlib.compressobj(9, zlib.DEFLATED, 31),
                                  "bz2": lambda: bz2.BZ2Compressor(9),
                                  "xz": lambda: lzma.LZMACompressor(lzma.FORMAT_XZ, preset=0)}[kind]
    packer = make()
    out = bytearray()
    for part in parts:
        out += packer.compress(part)  # type: ignore[attr-defined]
    out += packer.flush()  # type: ignore[attr-defined]
    return bytes(out)


def hostile(declared: int = 128 << 20) -> dict[str, bytes]:
    """One tarball of each class: a GNU long name, a GNU long link name, a pax header and a pax global header,
    each declaring ``declared`` bytes; the long name again under bzip2 and xz; and a member whose zeros
    inflate past any submission (a plain gzip bomb)."""
    out = {f"{name}-gz": compressed(_stream(declared, flag), "gz")
           for name, flag in (("gnu-long-name", b"L"), ("gnu-long-link", b"K"), ("pax-header", b"x"),
                              ("pax-global-header", b"g"))}
    out["gnu-long-name-bz2"] = compressed(_stream(declared, b"L"), "bz2")
    out["gnu-long-name-xz"] = compressed(_stream(declared, b"L"), "xz")
    out["member-bomb-gz"] = compressed(_stream(declared, b"0"), "gz")
    return out
