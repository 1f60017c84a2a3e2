#!/usr/bin/env python3
"""Checks the documentation: the README stays a front page, its links resolve, every page of the book
has one title, and the pages generated from the code are current.

README.md is hand-written (a front page, under 300 lines). The book is `docs/` with `mkdocs.yml` at the
root (built by `.ci/steps/20-docs.sh` with `mkdocs build --strict`, which fails on broken internal links).
Three pages in it are generated from the code, each by a test that compares and fails when the page is
stale (SWITCHLESS_UPDATE_DOCS=1 makes the same tests rewrite them):

  docs/reference/environment.md      src/config/mod.rs (the `variables!` table)   cargo test --lib config::
  docs/reference/doctor-findings.md  src/tools/doctor/registry.rs (+ the tables    cargo test --lib doctor::registry
                                     in docs/guide/doctor.md and plan.md)
  docs/reference/cli.md              src/tools/cli/ (clap)                         cargo test --lib tools::cli::reference

Usage: scripts/docs.py --check             all of it (runs the three tests through cargo)
       scripts/docs.py --check --no-cargo  the README checks only
       scripts/docs.py --update            rewrite the generated pages (SWITCHLESS_UPDATE_DOCS=1)"""
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README_MAX_LINES = 300
# The tests that compare each generated page with the code (libtest takes several filters).
TESTS = ["config::tests::documentation_table_is_current",
         "doctor::registry::tests::documentation_tables_are_current",
         "tools::cli::reference::tests::page_is_current"]


def readme_problems():
    path = os.path.join(ROOT, "README.md")
    text = open(path, encoding="utf-8").read()
    problems = []
    n = text.count("\n")
    if n >= README_MAX_LINES:
        problems.append(f"README.md has {n} lines; keep it a front page under {README_MAX_LINES} "
                        "(details belong in docs/)")
    # Relative links and images must name files that exist (the book's own links mkdocs checks).
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text) + re.findall(r'src="([^"]+)"', text):
        if re.match(r"[a-z]+:", target):
            continue
        if not os.path.exists(os.path.join(ROOT, target)):
            problems.append(f"README.md links to {target}, which does not exist")
    return problems


def page_problems():
    """Every page of the book has exactly one `#` title, its first line (mkdocs takes it as the page title)."""
    problems = []
    for d, _, files in os.walk(os.path.join(ROOT, "docs")):
        for f in sorted(files):
            if not f.endswith(".md"):
                continue
            path = os.path.join(d, f)
            rel = os.path.relpath(path, ROOT)
            lines = open(path, encoding="utf-8").read().split("\n")
            fence, titles = False, 0
            for line in lines:
                if line.lstrip().startswith("```"):
                    fence = not fence
                elif not fence and line.startswith("# "):
                    titles += 1
            if titles != 1 or not lines[0].startswith("# "):
                problems.append(f"{rel}: {titles} '# ' titles; a page starts with its one title")
    return problems


def cargo(update):
    env = dict(os.environ)
    if update:
        env["SWITCHLESS_UPDATE_DOCS"] = "1"
    cmd = ["cargo", "test", "--quiet", "--locked", "--lib", "--"] + TESTS
    return subprocess.run(cmd, cwd=ROOT, env=env).returncode == 0


def main():
    args = sys.argv[1:]
    if args == ["--update"]:
        sys.exit(0 if cargo(update=True) else 1)
    if not args or args[0] != "--check" or not set(args[1:]) <= {"--no-cargo"}:
        sys.exit(__doc__)
    problems = readme_problems() + page_problems()
    for p in problems:
        print(f"docs: {p}", file=sys.stderr)
    ok = not problems
    if "--no-cargo" not in args and not cargo(update=False):
        print("docs: a generated page is stale: run scripts/docs.py --update", file=sys.stderr)
        ok = False
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
