#!/usr/bin/env python3
"""The import cycles among a crate's modules.

Every `crate::`/`super::` path (and a parent module's paths into its own submodules) is an edge
from the module that writes it to the module that defines the item, following `pub use`
re-exports to the defining module. A module's use of its own submodules (a facade's dispatch
and re-exports) is not counted unless --strict.

    scripts/module_cycles.py [SRC_DIR (default codegen/src)] [--tests] [--edges] [--strict]

--tests counts `#[cfg(test)]` code too; --edges prints every module's edges. Prints the
strongly connected groups of modules; exit status 1 when there is one.
"""
import os, re, signal, sys

signal.signal(signal.SIGPIPE, signal.SIG_DFL)
args = [a for a in sys.argv[1:] if not a.startswith('-')]
root = args[0] if args else 'codegen/src'
with_tests = '--tests' in sys.argv
files = {}
for d, _, fs in os.walk(root):
    for f in fs:
        if f.endswith('.rs'):
            p = os.path.join(d, f)
            parts = os.path.relpath(p, root)[:-3].split('/')
            if parts[-1] in ('mod', 'lib'):
                parts = parts[:-1]
            files[tuple(parts)] = p
mods = set(files)
def strip_tests(src):
    out = []; i = 0
    while True:
        m = re.search(r'#\[cfg\(test\)\]\s*', src[i:])
        if not m: out.append(src[i:]); break
        s = i + m.start(); e = i + m.end()
        out.append(src[i:s])
        semi = src.find(';', e); brace = src.find('{', e)
        if brace == -1 or (semi != -1 and semi < brace):
            i = semi + 1
        else:
            depth = 0; k = brace
            while k < len(src):
                if src[k] == '{': depth += 1
                elif src[k] == '}':
                    depth -= 1
                    if depth == 0: break
                k += 1
            i = k + 1
    return ''.join(out)
reexports = {}  # (module, name) -> module the item is defined in
def resolve(path):
    for n in range(len(path), 0, -1):
        if tuple(path[:n]) in mods:
            m = tuple(path[:n])
            # follow re-exports (`pub use child::item`) to the module that defines the item
            while n < len(path) and (m, path[n]) in reexports and reexports[(m, path[n])] != m:
                m = reexports[(m, path[n])]
            return m
    return ()
def expand(prefix, body):
    body = body.strip()
    if body.startswith('{'):
        inner = body[1:body.rfind('}')]
        items, depth, cur = [], 0, ''
        for ch in inner:
            if ch == ',' and depth == 0: items.append(cur); cur = ''; continue
            if ch == '{': depth += 1
            if ch == '}': depth -= 1
            cur += ch
        items.append(cur)
        res = []
        for it in items:
            if it.strip(): res += expand(prefix, it)
        return res
    m = re.match(r'([A-Za-z_0-9]+)(\s*::\s*(.*))?$', body, re.S)
    if not m: return [prefix]
    name = m.group(1)
    if name == 'self': return [prefix]
    if name == 'super': return expand(prefix[:-1], m.group(3) or '')
    if m.group(3): return expand(prefix + [name], m.group(3))
    return [prefix + [name]]
for mod, p in files.items():
    src = re.sub(r'//[^\n]*', '', open(p).read())
    for m in re.finditer(r'pub(?:\([a-z]+\))?\s+use\s+([^;]+);', src):
        tree = m.group(1)
        base = [] if tree.startswith('crate') else list(mod)
        tree = re.sub(r'^crate\s*::\s*', '', tree)
        # simple forms: a::b::{x, y as z} / a::b::x / a::b::x as z
        mm = re.match(r'((?:[a-z_0-9]+\s*::\s*)+)(\{[^}]*\}|[A-Za-z_0-9]+(?:\s+as\s+[A-Za-z_0-9]+)?)$', tree.strip())
        if not mm: continue
        prefix = base + [x.strip() for x in mm.group(1).split('::') if x.strip()]
        items = mm.group(2).strip('{}').split(',')
        for it in items:
            it = it.strip()
            if not it or it == 'self': continue
            parts = re.split(r'\s+as\s+', it)
            t = tuple(prefix)
            while t and t not in mods: t = t[:-1]
            if t and t != mod:
                reexports[(mod, parts[-1])] = t
edges = {}
for mod, p in files.items():
    src = re.sub(r'//[^\n]*', '', open(p).read())
    if not with_tests: src = strip_tests(src)
    targets = set()
    for m in re.finditer(r'\b(crate|super)\s*::', src):
        if m.start() > 0 and src[m.start()-1] == ':': continue
        rest = src[m.end():].lstrip()
        if rest.startswith('{'):
            depth = 0
            for k, ch in enumerate(rest):
                if ch == '{': depth += 1
                elif ch == '}':
                    depth -= 1
                    if depth == 0: break
            body = rest[:k+1]
        else:
            mm = re.match(r'[A-Za-z_0-9]+(\s*::\s*(?:[A-Za-z_0-9]+|\{[^;]*?\}))*', rest)
            body = mm.group(0) if mm else ''
        prefix = [] if m.group(1) == 'crate' else list(mod[:-1])
        for path in expand(prefix, body):
            t = resolve(path)
            if t != mod and t != ():
                targets.add(t)
    if p.endswith(('mod.rs', 'lib.rs')):
        # paths relative to this module: `child::item`, `self::child`
        kids = {m[-1] for m in mods if len(m) == len(mod) + 1 and m[:len(mod)] == mod}
        for m in re.finditer(r'(?<![:\w])(?:self\s*::\s*)?([a-z_0-9]+)\s*::', src):
            if m.group(1) in kids:
                targets.add(mod + (m.group(1),))
    if '--strict' not in sys.argv:
        # a module may use its own submodules (a facade's re-exports and dispatch)
        targets = {t for t in targets if t[:len(mod)] != mod}
    edges[mod] = targets
name = lambda m: '/'.join(m) or 'lib'
if '--edges' in sys.argv:
    for m in sorted(edges):
        print(name(m), '->', ', '.join(sorted(name(t) for t in edges[m])))
idx = {}; low = {}; st = []; on = set(); sccs = []; c = [0]
sys.setrecursionlimit(10000)
def sc(v):
    idx[v] = low[v] = c[0]; c[0] += 1; st.append(v); on.add(v)
    for w in sorted(edges.get(v, ())):
        if w not in idx: sc(w); low[v] = min(low[v], low[w])
        elif w in on: low[v] = min(low[v], idx[w])
    if low[v] == idx[v]:
        comp = []
        while True:
            w = st.pop(); on.discard(w); comp.append(w)
            if w == v: break
        sccs.append(comp)
for v in sorted(edges):
    if v not in idx: sc(v)
cyc = [s for s in sccs if len(s) > 1]
print(f'{len(cyc)} cycle(s) (strongly connected groups of modules, tests {"included" if with_tests else "excluded"}):')
for s in cyc:
    print('  ', ' <-> '.join(sorted(name(m) for m in s)))
    for m in sorted(s):
        print('      ', name(m), '->', ', '.join(sorted(name(t) for t in edges[m] if t in s)))
sys.exit(1 if cyc else 0)
