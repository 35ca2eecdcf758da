#!/usr/bin/env python3
"""A uniform importance matrix (all ones) for every 2-D or 3-D weight of a
model, in llama.cpp's legacy .dat format (int32 n_entries; per entry int32
name length, the name, int32 calls, int32 n, n f32; then int32 last call,
int32 length, dataset name), from `kvseal inspect MODEL` on stdin.
llama-quantize refuses IQ1_*, IQ2_XXS/XS/S and IQ3_XXS without one, and
uniform importance is what the tests and benchmarks want.

usage: kvseal inspect MODEL | scripts/uniform_imatrix.py OUT
"""
import struct
import sys


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__.strip().splitlines()[-1])
    ents = []
    for ln in sys.stdin:
        f = ln.split()
        if len(f) >= 3 and f[0].endswith(".weight") and f[2].startswith("["):
            dims = [int(v) for v in " ".join(f[2:]).split("]")[0].strip("[").split(",")]
            if len(dims) >= 2:  # n = ne[0] * experts
                ents.append((f[0].encode(), dims[0] * (dims[2] if len(dims) > 2 else 1)))
    with open(sys.argv[1], "wb") as out:
        out.write(struct.pack("<i", len(ents)))
        for name, n in ents:
            out.write(struct.pack("<i", len(name)) + name + struct.pack("<ii", 1, n))
            out.write(struct.pack("<%df" % n, *([1.0] * n)))
        out.write(struct.pack("<ii", 1, 4) + b"ones")


if __name__ == "__main__":
    main()
