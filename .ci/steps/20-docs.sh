#!/usr/bin/env bash
# docs: build the book (mkdocs.yml, pages under docs/) with `mkdocs build --strict`, so a broken internal
# link or a page missing from the navigation fails. mkdocs (pinned in scripts/docs-requirements.txt) lives in a
# virtual environment under target/, installed by pip on first use; the step takes a few seconds after that.
set -euo pipefail
cd "$(dirname "$0")/../.."
venv="${CARGO_TARGET_DIR:-target}/docs-venv"
if ! "$venv/bin/mkdocs" --version 2>/dev/null | grep -q "version $(sed -n 's/^mkdocs==//p' scripts/docs-requirements.txt) "; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check -r scripts/docs-requirements.txt
fi
"$venv/bin/mkdocs" build --strict --site-dir "${CARGO_TARGET_DIR:-target}/book"
echo "docs: book built in ${CARGO_TARGET_DIR:-target}/book"
