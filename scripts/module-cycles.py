#!/usr/bin/env python3
"""The module import graph of one crate, and the circles in it.

    python3 scripts/module-cycles.py booking-api/src [-v]

Each file of `src/` is a module; `crate::a::b` and `super::` paths (test modules
left out) are its imports of the longest module they name. Prints every circle
(strongly connected set of modules) and exits 1 if there is one; `-v` prints every
module's imports. A text scan, not the compiler: good enough to keep layers honest
(docs/architecture.md, "The booking service's modules")."""
import os, re, sys
root = sys.argv[1]  # e.g. booking-api/src
files = {}
for d, _, fs in os.walk(root):
    for f in fs:
        if f.endswith('.rs'):
            p = os.path.join(d, f)
            rel = os.path.relpath(p, root)[:-3]
            parts = rel.split(os.sep)
            if parts[-1] in ('mod', 'lib'):
                parts = parts[:-1]
            files['::'.join(parts)] = p
def strip_tests(src):
    i = src.find('#[cfg(test)]')
    return src if i < 0 else src[:i]
edges = {m: set() for m in files}
for m, p in files.items():
    src = strip_tests(open(p).read())
    src = re.sub(r'//[^\n]*', '', src)
    paths = set()
    for mt in re.finditer(r'\b(crate|super)((?:::\w+)+)', src):
        head, tail = mt.group(1), mt.group(2).split('::')[1:]
        if head == 'super':
            base = m.split('::')[:-1] if m else []
            # super of a mod.rs module's child
            parts = base + tail
        else:
            parts = tail
        paths.add(tuple(parts))
    # use crate::x::{a, b}
    for mt in re.finditer(r'use\s+(crate|super)((?:::\w+)*)::\{([^}]*)\}', src, re.S):
        head = mt.group(1); pre = [x for x in mt.group(2).split('::') if x]
        base = (m.split('::')[:-1] if head == 'super' else [])
        for item in mt.group(3).split(','):
            item = item.strip().split(' as ')[0].split('::')
            if item and item[0] and item[0] != 'self':
                paths.add(tuple(base + pre + item))
    for parts in paths:
        # longest prefix that is a module
        for k in range(len(parts), 0, -1):
            cand = '::'.join(parts[:k])
            if cand in files:
                if cand != m and not m.startswith(cand + '::') :
                    edges[m].add(cand)
                break
# Tarjan
idx = {}; low = {}; st = []; on = set(); sccs = []; c = [0]
sys.setrecursionlimit(10000)
def sc(v):
    idx[v] = low[v] = c[0]; c[0] += 1; st.append(v); on.add(v)
    for w in edges[v]:
        if w not in idx:
            sc(w); low[v] = min(low[v], low[w])
        elif w in on:
            low[v] = min(low[v], idx[w])
    if low[v] == idx[v]:
        comp = []
        while True:
            w = st.pop(); on.discard(w); comp.append(w)
            if w == v: break
        sccs.append(comp)
for v in edges:
    if v not in idx: sc(v)
bad = [s for s in sccs if len(s) > 1]
for s in bad:
    print(len(s), 'modules in a cycle:', ' '.join(sorted(s)))
    for v in sorted(s):
        print('   ', v, '->', ' '.join(sorted(w for w in edges[v] if w in s)))
if '-v' in sys.argv:
    for v in sorted(edges): print(v or '(lib)', '->', ' '.join(sorted(edges[v])))
sys.exit(1 if bad else 0)
