#!/usr/bin/env python3
"""Assembles README.md from the sections in docs/readme/ (each topic is edited there, next to its owner's
tests; e.g. the table of variables in docs/readme/config.md is generated from src/config/mod.rs by
`SWITCHLESS_UPDATE_DOCS=1 cargo test --lib config::`, and that test fails when the page is stale).

Usage: scripts/readme.py          write README.md
       scripts/readme.py --check  exit 1 when README.md is not what the sections give (CI)"""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ORDER = ["ffi", "config", "config-verbs", "fabric", "fleet", "plan", "route", "core", "transport", "tcp", "lab",
         "nccltests", "99-development"]


def anchor(title):
    return re.sub(r"[^a-z0-9 -]", "", title.lower()).replace(" ", "-")


def build():
    d = os.path.join(ROOT, "docs", "readme")
    intro = open(os.path.join(d, "00-intro.md")).read().strip() + "\n"
    body, toc = [], []
    for name in ORDER:
        text = open(os.path.join(d, name + ".md")).read().strip() + "\n"
        toc += [f"- [{l[3:].strip()}](#{anchor(l[3:].strip())})" for l in text.splitlines() if l.startswith("## ")]
        body.append(text)
    return intro + "\n## Contents\n\n" + "\n".join(toc) + "\n\n" + "\n".join(body)


def main():
    text = build()
    path = os.path.join(ROOT, "README.md")
    if sys.argv[1:] == ["--check"]:
        if open(path).read() != text:
            sys.exit("README.md is out of date: run scripts/readme.py")
        return
    open(path, "w").write(text)


if __name__ == "__main__":
    main()
