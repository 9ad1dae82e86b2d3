"""zobench-z's Gaussian z (docs/zrng.md, "Gaussian z"): 65,536 float32 quantiles of N(0, 1) that
every runtime indexes by the top 16 bits of bits32. This file is the table's one home and no copy
of it is committed: workloads/zrng.py computes it here, and the C++ build runs this file to write
the header the binary compiles in (workloads/cpp/CMakeLists.txt).

    python3 workloads/gauss_table.py OUT.hpp

Entry j is the normal quantile at (j + 0.5) / 65536 (the standard library's NormalDist, float64),
made exactly symmetric (entry 65535 - j is -entry j), all scaled by one factor to unit variance (an
exactly rounded sum), then rounded to float32. The standard library only: cmake runs it with the
build machine's python3, before a venv exists. A libm that rounded a float64 quantile otherwise
could move an entry by one float32 ulp on another host; SHA256 pins the table that docs/zrng.md's
known answers and the committed records were drawn with, and tests/test_zrng.py checks it."""
from __future__ import annotations

import hashlib
import math
import statistics
import struct
import sys
from pathlib import Path

BITS = 16
SHIFT = 32 - BITS                 # z = table[bits32 >> SHIFT]
SIZE = 1 << BITS
SHA256 = "8babbcaf96568f10165a1eab530c0e5c92d04de96761b6dbb3dadfa94baba37f"   # of the entries, little-endian


def words() -> tuple[int, ...]:
    """The entries as their float32 bits."""
    inv = statistics.NormalDist().inv_cdf
    q = [inv((j + 0.5) / SIZE) for j in range(SIZE)]
    q = [(a - b) / 2 for a, b in zip(q, reversed(q))]
    scale = math.sqrt(math.fsum(x * x for x in q) / SIZE)
    return struct.unpack(f"<{SIZE}I", struct.pack(f"<{SIZE}f", *(x / scale for x in q)))


def digest(entries: tuple[int, ...]) -> str:
    return hashlib.sha256(struct.pack(f"<{len(entries)}I", *entries)).hexdigest()


def header(entries: tuple[int, ...]) -> str:
    """The C++ header: each entry as its float32 bits (exact, and a third the size of hex floats)."""
    rows = (", ".join(f"0x{w:08x}u" for w in entries[i:i + 8]) for i in range(0, len(entries), 8))
    return ("// Written at build time by workloads/gauss_table.py, the table's one home (docs/zrng.md):\n"
            f"// z = GAUSS_BITS[bits32 >> {SHIFT}], each entry an N(0, 1) quantile's float32 bits.\n"
            "#pragma once\n#include <cstdint>\n\nnamespace zrng {\n"
            f"inline constexpr int GAUSS_SHIFT = {SHIFT};\n"
            f"alignas(64) inline const uint32_t GAUSS_BITS[{len(entries)}] = {{\n" + ",\n".join(rows) + "};\n"
            "}  // namespace zrng\n")


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(f"usage: python3 {Path(__file__).name} OUT.hpp", file=sys.stderr)
        return 2
    out = Path(argv[0])
    text = header(words())
    if not out.is_file() or out.read_text() != text:      # unchanged: the binary is not rebuilt for it
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
