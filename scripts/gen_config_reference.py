"""Write the configuration reference, docs/reference/*.md, from the installed plugins' config models.

    uv run python scripts/gen_config_reference.py          # (re)write the pages
    uv run python scripts/gen_config_reference.py --check  # exit 1, naming the stale pages, when they differ

The pages are rendered by :func:`roll.core.config.reference.reference_pages`; tests/test_docs.py regenerates
them in memory and compares, so CI fails when a config model changes and this script was not rerun.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from roll.core.config.reference import reference_pages

OUT = Path(__file__).resolve().parents[1] / "docs" / "reference"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="compare only; exit 1 when a page is stale")
    args = parser.parse_args()
    pages = reference_pages()
    stale = [name for name, text in pages.items() if _read(OUT / name) != text]
    if args.check:
        for name in stale:
            print(f"stale: docs/reference/{name} (run: uv run python scripts/gen_config_reference.py)")
        return 1 if stale else 0
    OUT.mkdir(parents=True, exist_ok=True)
    for name in stale:
        (OUT / name).write_text(pages[name], encoding="utf-8")
    lines = sum(text.count("\n") for text in pages.values())
    print(f"docs/reference: {len(pages)} pages, {lines} lines, {len(stale)} rewritten")
    return 0


def _read(path: Path) -> str | None:
    return path.read_text(encoding="utf-8") if path.exists() else None


if __name__ == "__main__":
    sys.exit(main())
