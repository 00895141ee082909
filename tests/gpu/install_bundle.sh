#!/usr/bin/env bash
# Install a bundle made by tests/gpu/bundle.py, offline, beside a Python's own packages, leaving them untouched.
#
#   bash tests/gpu/install_bundle.sh PYTHON BUNDLE.tar.xz SITE      then: export PYTHONPATH=SITE
#   (SITE's path must contain 'site-packages', e.g. /tmp/roll-gpu/site-packages: see below)
#
# 1. unpacks BUNDLE next to SITE (Python's tarfile: no xz binary needed);
# 2. asks PYTHON's pip, with --dry-run --no-index, which of the bundle's wheels the requirements need *given what
#    PYTHON already has*: pip's resolver keeps every installed package that satisfies them (the machine's torch,
#    transformers, numpy...) and fails loudly, naming the requirement, where one does not and the bundle has no
#    wheel for it;
# 3. installs exactly those wheels with --no-deps --target SITE, so the environment itself is not modified.
# Prints what it installs and which installed versions it shadows.
set -euo pipefail
[ $# -eq 3 ] || { echo "usage: $0 PYTHON BUNDLE.tar.xz SITE" >&2; exit 2; }
PY=$1 BUNDLE=$2 SITE=$3
# dill (datasets' fingerprints) pickles a module by reference only if its path says it is installed (prefix or
# 'site-packages'); from any other folder it pickles pyarrow by value and fails ("Can't pickle MonthDayNano").
[[ "$SITE" == *site-packages* ]] || { echo "install_bundle: SITE must have 'site-packages' in its path: $SITE" >&2; exit 2; }
UNPACKED="$SITE.bundle"
rm -rf "$SITE" "$UNPACKED" && mkdir -p "$UNPACKED"
"$PY" - "$BUNDLE" "$UNPACKED" <<'PY'
import sys, tarfile
with tarfile.open(sys.argv[1]) as tar:
    tar.extractall(sys.argv[2], filter="data")
PY
"$PY" -m pip install --dry-run --quiet --no-index --find-links "$UNPACKED/wheels" --report "$UNPACKED/report.json" \
  -r "$UNPACKED/requirements.txt"
mapfile -t WHEELS < <("$PY" - "$UNPACKED/report.json" <<'PY'
import json, sys
from importlib.metadata import PackageNotFoundError, version
from urllib.parse import unquote, urlparse
items = json.load(open(sys.argv[1]))["install"]
for item in items:
    name, new = item["metadata"]["name"], item["metadata"]["version"]
    try:
        print(f"  {name} {new} (shadows the installed {version(name)})", file=sys.stderr)
    except PackageNotFoundError:
        print(f"  {name} {new}", file=sys.stderr)
    print(unquote(urlparse(item["download_info"]["url"]).path))
print(f"installing {len(items)} wheels from the bundle; everything else comes from the environment", file=sys.stderr)
PY
)
"$PY" -m pip install --quiet --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" "${WHEELS[@]}"
echo "installed into $SITE ($(du -sh "$SITE" | cut -f1)); use it with: export PYTHONPATH=$SITE"
