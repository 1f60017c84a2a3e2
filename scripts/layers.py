#!/usr/bin/env python3
"""Checks the shape of src/ (CI runs it; the layer map is in docs/guide/contributing.md):

1. No import cycle between the top-level modules of src/ (ffi, plugin, route, ...), nor between the
   files of any one module folder. An import is a path a file names: `use crate::a::b`, `crate::a::b::f()`,
   `super::x`, `self::x`. A folder's mod.rs declaring its children (`mod x;`) is containment, not an
   import; a child naming an item of its parent (`super::Item`) is an import of mod.rs.
2. `unsafe` only in src/ffi/, src/verbs/ and src/sys/ (the modules that `allow(unsafe_code)`), and no
   other file allows it.
3. No stale promise in a doc comment ("... are planned", "not wired yet", "until the ... lands").

Usage: scripts/layers.py [--graph]   (--graph prints the top-level arrows)
Exit status 0 when all hold, 1 with one line per violation otherwise."""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SRC = os.path.join(ROOT, "src")
UNSAFE_HOMES = ("ffi", "verbs", "sys")
STALE = re.compile(r"//[!/].*\b(are planned|is planned|not wired yet|(once|until) the \w+ (lands|has landed))\b", re.I)


def strip(text):
    """Source without comments, string literals and #[cfg(test)] modules (tests may import anything)."""
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    text = re.sub(r'r#*"(?:.|\n)*?"#*', '""', text)
    text = re.sub(r'"(?:\\.|[^"\\])*"', '""', text)
    text = re.sub(r"'(?:\\.|[^'\\])'", "' '", text)
    text = "\n".join(l.split("//", 1)[0] for l in text.splitlines())
    m = re.search(r"#\[cfg\(test\)\]\s*(pub(\([^)]*\))?\s+)?mod\s+\w+\s*\{", text)
    return text[: m.start()] if m else text


def modules():
    """Module path (tuple) -> file, for every .rs file under src/ (bin/ excluded)."""
    out = {}
    for d, _, files in os.walk(SRC):
        for f in files:
            if not f.endswith(".rs"):
                continue
            p = os.path.join(d, f)
            rel = os.path.relpath(p, SRC)
            if rel.startswith("bin" + os.sep):
                continue
            parts = rel[:-3].split(os.sep)
            if parts[-1] in ("mod", "lib"):
                parts = parts[:-1]
            out[tuple(parts)] = p
    return out


def resolve(mods, base, path):
    """The module (longest known prefix) a path names, from module `base`."""
    segs = path.split("::")
    if segs[0] == "crate":
        cur, rest = (), segs[1:]
    elif segs[0] in ("super", "self"):
        cur = base
        rest = segs
        while rest and rest[0] in ("super", "self"):
            if rest[0] == "super":
                cur = cur[:-1]
            rest = rest[1:]
    else:
        return None
    best = cur if cur in mods else None
    for i in range(len(rest)):
        cand = cur + tuple(rest[: i + 1])
        if cand in mods:
            best = cand
        else:
            break
    return best


def use_paths(text):
    """Every path a file names: expands `use a::{b, c::{d}}` groups and finds inline `crate::`/`super::` paths."""
    paths = []
    for m in re.finditer(r"\buse\s+([^;]+);", text):
        paths += expand(m.group(1).strip())
    text = re.sub(r"\buse\s+[^;]+;", "", text)
    paths += re.findall(r"\b(?:crate|super|self)(?:::\w+)+", text)
    return paths


def expand(tree):
    tree = re.sub(r"\s+", "", tree)
    if "{" not in tree:
        return [re.sub(r"as\w+$", "", tree)]
    i = tree.index("{")
    prefix, inner = tree[:i], tree[i + 1 : tree.rindex("}")]
    out, depth, cur = [], 0, ""
    for ch in inner + ",":
        if ch == "," and depth == 0:
            if cur:
                out += [prefix + p for p in expand(cur)]
            cur = ""
            continue
        depth += ch == "{"
        depth -= ch == "}"
        cur += ch
    return [p.rstrip(":") for p in out]


def cycles(edges):
    """Strongly connected components of size > 1 (Tarjan)."""
    index, low, stack, on, comps, n = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return comps


def main():
    mods = modules()
    problems = []
    top, folder = {}, {}
    evidence = {}
    for mod, path in sorted(mods.items()):
        raw = open(path, encoding="utf-8").read()
        text = strip(raw)
        rel = os.path.relpath(path, ROOT)
        for p in use_paths(text):
            tgt = resolve(mods, mod, p)
            if tgt is None or tgt == mod:
                continue
            if mod and tgt and mod[0] != tgt[0]:
                top.setdefault(mod[0], set()).add(tgt[0])
                evidence.setdefault((mod[0], tgt[0]), f"{rel}: {p}")
            # Files of one folder: the folder of `mod`'s file, and the target inside that folder.
            fdir = os.path.dirname(path)
            tpath = mods[tgt]
            if os.path.dirname(tpath) == fdir and tpath != path:
                folder.setdefault(fdir, {}).setdefault(path, set()).add(tpath)
                evidence.setdefault((path, tpath), f"{rel}: {p}")
        top_name = mod[0] if mod else ""
        if re.search(r"\bunsafe\b", text) and top_name not in UNSAFE_HOMES:
            problems.append(f"{rel}: `unsafe` outside src/{{{','.join(UNSAFE_HOMES)}}}")
        if "allow(unsafe_code)" in text and top_name not in UNSAFE_HOMES:
            problems.append(f"{rel}: allows unsafe_code outside src/{{{','.join(UNSAFE_HOMES)}}}")
        for i, line in enumerate(raw.splitlines(), 1):
            if STALE.search(line):
                problems.append(f"{rel}:{i}: stale promise in a doc comment: {line.strip()}")
    for comp in cycles(top):
        arrows = [evidence[(a, b)] for a in comp for b in comp if (a, b) in evidence]
        problems.append(f"import cycle between top-level modules {' <-> '.join(comp)} ({'; '.join(arrows)})")
    for fdir, edges in sorted(folder.items()):
        for comp in cycles(edges):
            arrows = [evidence[(a, b)] for a in comp for b in comp if (a, b) in evidence]
            names = [os.path.relpath(c, ROOT) for c in comp]
            problems.append(f"import cycle inside {os.path.relpath(fdir, ROOT)}/: {' <-> '.join(names)} ({'; '.join(arrows)})")
    if "--graph" in sys.argv:
        for a in sorted(top):
            print(f"{a} -> {', '.join(sorted(top[a]))}")
    for p in problems:
        print(f"layers: {p}")
    if not problems:
        print(f"layers: {len(mods)} modules; no import cycle between top-level modules or inside a folder; unsafe only in src/{{{','.join(UNSAFE_HOMES)}}}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
