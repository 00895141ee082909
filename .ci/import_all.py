"""Import every module of the given packages (but those after ``--skip``); print how many, and fail naming each
module that does not import, with its traceback."""

from __future__ import annotations

import importlib
import pkgutil
import sys
import traceback


def main(packages: list[str], skip: set[str]) -> int:
    failed: list[str] = []
    count = 0
    for top in packages:
        package = importlib.import_module(top)
        for info in pkgutil.walk_packages(package.__path__, f"{top}."):
            if info.name in skip:
                continue
            count += 1
            try:
                importlib.import_module(info.name)
            except Exception:
                failed.append(f"{info.name}:\n{traceback.format_exc()}")
    print(f"{count} modules of {', '.join(packages)} imported, {len(failed)} failed")
    for failure in failed:
        print(failure, file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    args = sys.argv[1:]
    cut = args.index("--skip") if "--skip" in args else len(args)
    sys.exit(main(args[:cut], set(args[cut + 1 :])))
