#!/usr/bin/env python3
"""The house check: the shape of src/ that issue 39 asks to keep.

Reads the module libraries a build made (build/libks_*.a) with `nm`, and
draws the graph "file A calls a function file B defines" over the object
files of src/. It reports
  - the circles: sets of files that call each other in a loop (strongly
    connected components of more than one file);
  - the arrows between modules that run against the module order of
    CMakeLists.txt (a lower floor calling a higher one);
  - the files of src/ over the size limit (kern/ is exempt: its kernels
    are long by nature);
  - public headers (include/kvseal/) that leak what callers may not use:
    declarations behind a test-only build switch (#ifdef KS_TEST_FAULTS,
    KS_BROKEN_*: the fault injectors belong in src/<module>/<module>_fault.h)
    or an #include of anything but another public header or a system
    header.
Exit status 1 when there are more circles than --max-circles, any arrow
runs back up beyond --max-up, a file is over the limit, or a public
header leaks.

usage: scripts/house.py [--build DIR] [--src DIR] [--include DIR]
                        [--max-circles N] [--max-up N] [--max-lines N] [-v]
"""
import argparse
import os
import re
import subprocess
import sys

# the module order of CMakeLists.txt's ks_module() calls, lowest floor first
MODULES = ["base", "gguf", "jinja", "tok", "kern", "kv", "pd", "model",
           "grammar", "engine", "server", "cluster", "cli"]


def objects(build):
    """{node: (defined set, undefined set)}, node = 'module/file.c'."""
    out = {}
    for mod in MODULES:
        lib = os.path.join(build, "libks_%s.a" % mod)
        if not os.path.exists(lib):
            continue
        text = subprocess.run(["nm", "-A", "--defined-only", lib], capture_output=True,
                              text=True, check=True).stdout
        text += subprocess.run(["nm", "-A", "--undefined-only", lib], capture_output=True,
                               text=True, check=True).stdout
        for line in text.splitlines():
            # libks_x.a:file.c.o:0000 T name   |   libks_x.a:file.c.o:  U name
            m = re.match(r"[^:]+:([^:]+)\.o:\s*(?:[0-9a-f]+)?\s+(\w)\s+(\S+)$", line)
            if not m:
                continue
            node = "%s/%s" % (mod, m.group(1))
            d, u = out.setdefault(node, (set(), set()))
            kind, sym = m.group(2), m.group(3)
            if kind == "U":
                u.add(sym)
            elif kind in "TDBR":
                d.add(sym)
    return out


def graph(objs):
    owner = {}
    for node, (d, _) in objs.items():
        for s in d:
            owner[s] = node
    edges = {n: set() for n in objs}
    for node, (_, u) in objs.items():
        for s in u:
            o = owner.get(s)
            if o and o != node:
                edges[node].add(o)
    return edges


def sccs(edges):
    """Tarjan's algorithm, iterative; returns the components of > 1 node."""
    index, low, on, stack, out = {}, {}, set(), [], []
    counter = [0]
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            nxt = next(it, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter[0]
                    counter[0] += 1
                    stack.append(nxt)
                    on.add(nxt)
                    work.append((nxt, iter(sorted(edges[nxt]))))
                elif nxt in on:
                    low[v] = min(low[v], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def header_leaks(include):
    """[(header, line number, why)] for the public headers' leaks."""
    out = []
    for f in sorted(os.listdir(include)):
        if not f.endswith(".h"):
            continue
        with open(os.path.join(include, f), encoding="utf-8", errors="replace") as fh:
            for i, line in enumerate(fh, 1):
                # a declaration behind the switch (a comment may name it)
                if re.match(r"\s*#\s*if.*\bKS_(TEST_FAULTS|BROKEN\w*)\b", line):
                    out.append((f, i, "declares behind a test-only build switch"))
                m = re.match(r'\s*#\s*include\s*"([^"]+)"', line)
                if m and not m.group(1).startswith("kvseal/"):
                    out.append((f, i, "includes the private %s" % m.group(1)))
    return out


def main():
    ap = argparse.ArgumentParser()
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--build", default=os.path.join(here, "..", "build"))
    ap.add_argument("--src", default=os.path.join(here, "..", "src"))
    ap.add_argument("--include", default=os.path.join(here, "..", "include", "kvseal"))
    ap.add_argument("--max-circles", type=int, default=1)
    ap.add_argument("--max-up", type=int, default=0)
    ap.add_argument("--max-lines", type=int, default=1500)
    ap.add_argument("-v", action="store_true", help="print every file's arrows")
    a = ap.parse_args()

    objs = objects(a.build)
    if not objs:
        print("house: no libks_*.a in %s (build first)" % a.build)
        return 2
    edges = graph(objs)
    bad = False

    circles = sccs(edges)
    print("house: %d files, %d circle(s)" % (len(objs), len(circles)))
    for c in circles:
        print("  circle: " + " <-> ".join(c))
    if len(circles) > a.max_circles:
        print("house: FAIL: %d circles, at most %d allowed" % (len(circles), a.max_circles))
        bad = True

    rank = {m: i for i, m in enumerate(MODULES)}
    up = sorted({(n.split("/")[0], o.split("/")[0], n, o) for n in edges for o in edges[n]
                 if rank[o.split("/")[0]] > rank[n.split("/")[0]]})
    for _, _, n, o in up:
        print("  arrow up: %s -> %s" % (n, o))
    if len(up) > a.max_up:
        print("house: FAIL: %d arrows run up the module order, at most %d allowed"
              % (len(up), a.max_up))
        bad = True

    for d, _, files in sorted(os.walk(a.src)):
        for f in sorted(files):
            if not f.endswith((".c", ".h")):
                continue
            p = os.path.join(d, f)
            rel = os.path.relpath(p, a.src)
            if rel.startswith("kern" + os.sep):
                continue
            with open(p, encoding="utf-8", errors="replace") as fh:
                n = sum(1 for _ in fh)
            if n > a.max_lines:
                print("house: FAIL: src/%s has %d lines, over %d" % (rel, n, a.max_lines))
                bad = True
    for f, i, why in header_leaks(a.include):
        print("house: FAIL: include/kvseal/%s:%d: %s" % (f, i, why))
        bad = True
    if a.v:
        for n in sorted(edges):
            print("%s -> %s" % (n, ", ".join(sorted(edges[n]))))
    print("house: " + ("FAIL" if bad else "ok"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
