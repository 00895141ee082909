"""Pack roll, Ray and every package a target Python lacks into one ``.tar.xz`` for an offline machine.

A lent GPU machine (tests/gpu/run.sh) reaches no registry and is carried at most 64 MiB with the working tree,
while Ray's wheel alone is ~78 MB. This script, run where PyPI is reachable (``bash tests/gpu/run.sh --prepare``
calls it), builds a bundle that fits:

1. resolve roll-core, roll-data, roll-workers[megatron] and roll-pipelines for the target (CPython ``--python``,
   manylinux x86_64) with ``uv pip compile``, the versions constrained to ``uv.lock`` and to the versions the
   target already has (``--have``: ``name`` or ``name==version`` lines, e.g. tests/gpu/image_packages.txt or a
   ``pip freeze``); where the two disagree the target's version wins, since it is what is installed there;
2. keep what the target lacks: the packages reached from roll's wheels without passing through one the target
   has (torch's CUDA libraries, needed only by torch, stay out); ``pip download`` their cp3X wheels, plus a spare
   wheel of each small package the target has at an unknown version that they need (pip there keeps the target's
   own where it satisfies them, and takes the spare where it does not);
3. slim Ray's wheel: drop the libraries roll never imports (``ray.rllib``, ``tune``, ``train``, ``serve``,
   ``data``, ``llm``), the Java jars and the dashboard's web client, strip the ELF files' symbols, and rewrite
   ``RECORD`` so the wheel stays valid;
4. re-zip every wheel uncompressed (pip installs stored wheels as well) so that xz, which cannot compress deflated
   data, compresses the whole tarball: ~2x smaller than the wheels as downloaded.

The tarball holds ``wheels/``, ``requirements.txt`` (what to install) and ``MANIFEST.txt`` (every wheel with its
size and the sha256 of the file as downloaded, what was slimmed, what is left to the target).
tests/gpu/install_bundle.sh installs it with ``pip --no-index``. Run it with a ``python3`` that has pip (it
downloads with ``python3 -m pip download``) and with ``uv`` on the PATH; it imports only the standard library.

    python3 tests/gpu/bundle.py --python 3.12 --have tests/gpu/image_packages.txt \\
        --out .gpu-bundle/roll-gpu-bundle-cp312.tar.xz
"""

from __future__ import annotations

import argparse
import base64
import csv
import hashlib
import io
import lzma
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ROLL_MEMBERS = ("roll-core", "roll-data", "roll-workers", "roll-pipelines")
REQUIREMENTS = ("roll-core", "roll-data", "roll-workers[megatron]", "roll-pipelines")
RAY_DROPPED = (
    "ray/rllib/",
    "ray/tune/",
    "ray/train/",
    "ray/serve/",
    "ray/data/",
    "ray/llm/",
    "ray/jars/",
    "ray/dashboard/client/",
)
"""Parts of Ray's wheel that roll never imports (``grep -r 'ray\\.' packages/``: ray, ray.util, ray.exceptions,
ray.cluster_utils, ray._private, ray.address); ``import ray`` and ``ray.init`` import none of them."""
SPARE_MAX_MIB = 3.0
PLATFORM = "x86_64-manylinux_2_28"
PIP_PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in range(28, 4, -1)] + [
    "manylinux2014_x86_64",
    "manylinux2010_x86_64",
    "manylinux1_x86_64",
]
"""pip matches a wheel's platform tag exactly, so every manylinux level up to ``PLATFORM``'s glibc is named."""


def norm(name: str) -> str:
    """PEP 503 normalized name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def read_have(path: Path) -> dict[str, str | None]:
    """``{name: version or None}`` from ``name`` / ``name==version`` lines; local labels (``+cpu``) dropped."""
    have: dict[str, str | None] = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line or line.startswith("-"):
            continue
        name, _, version = line.partition("==")
        have[norm(name)] = version.split("+", 1)[0].strip() or None
    return have


def run(cmd: list[str], **kwargs: object) -> str:
    """Run ``cmd``; on failure exit with its output, naming the command."""
    done = subprocess.run(cmd, capture_output=True, text=True, **kwargs)  # type: ignore[call-overload]
    if done.returncode != 0:
        sys.exit(f"bundle: `{' '.join(cmd)}` failed (rc {done.returncode}):\n{done.stdout}{done.stderr}")
    return str(done.stdout)


def lock_constraints(names: set[str]) -> list[str]:
    """uv.lock's pins of ``names`` (markers kept: uv evaluates them for the target)."""
    lines: set[str] = set()
    for package, extra in (("roll-pipelines", []), ("roll-workers", ["--extra", "megatron"])):
        out = run(
            ["uv", "export", "--frozen", "--no-dev", "--no-hashes", "--no-annotate", "--no-emit-workspace",
             "--package", package, *extra],
            cwd=ROOT,
        )  # fmt: skip
        lines |= {line for line in out.splitlines() if line and not line.startswith(("#", " "))}
    return sorted(line for line in lines if norm(line.split("==", 1)[0]) in names)


def resolve(
    work: Path, py: str, have: dict[str, str | None], roll_dir: Path, locked: set[str]
) -> dict[str, tuple[str, set[str]]] | None:
    """``{name: (version, parents)}`` for the target, the packages in ``locked`` at uv.lock's versions; a parent
    ``-r`` means a top-level requirement. None when ``locked`` is not empty and the lock's versions cannot meet the
    target's (uv's reason is printed)."""
    pins = [f"{name}=={version}" for name, version in have.items() if version]
    (work / "constraints.txt").write_text("\n".join([*lock_constraints(locked), *pins]) + "\n")
    (work / "requirements.in").write_text("\n".join(REQUIREMENTS) + "\n")
    argv = ["uv", "pip", "compile", "--no-header", "--annotation-style", "line", "--python-version", py,
            "--python-platform", PLATFORM, "--find-links", str(roll_dir), "-c", str(work / "constraints.txt"),
            str(work / "requirements.in")]  # fmt: skip
    env = {**os.environ, "UV_PYTHON_DOWNLOADS": "never"}
    done = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, env=env)
    if done.returncode != 0 and locked:
        print(f"bundle: uv.lock's versions do not fit the target's; resolving without them:\n{done.stderr}")
        return None
    out = done.stdout if done.returncode == 0 else run(argv, cwd=ROOT, env=env)
    resolved: dict[str, tuple[str, set[str]]] = {}
    for line in out.splitlines():
        match = re.match(r"^([A-Za-z0-9_.\-]+)(?:\[[^\]]*\])?==(\S+)\s*(?:#\s*via\s+(.*))?$", line.strip())
        if match:
            parents = {"-r" if p.startswith("-r") else norm(p) for p in (match[3] or "").split(", ") if p}
            resolved[norm(match[1])] = (match[2], parents)
    return resolved


def lacking(resolved: dict[str, tuple[str, set[str]]], have: dict[str, str | None]) -> dict[str, str]:
    """The resolved packages reached from the top-level requirements without passing through one in ``have``."""
    needed: set[str] = set()
    grew = True
    while grew:
        grew = False
        for name, (_, parents) in resolved.items():
            if name in needed or name in have:
                continue
            if "-r" in parents or parents & needed:
                needed.add(name)
                grew = True
    return {name: resolved[name][0] for name in sorted(needed)}


def leaned_on(resolved: dict[str, tuple[str, set[str]]], have: dict[str, str | None]) -> dict[str, str]:
    """Packages the target has at a version ``--have`` does not give that a lacking package (or a top-level
    requirement) needs directly: the bundle carries a spare wheel of each small one, in case the target's is too
    old or too new (pip keeps the target's where it satisfies)."""
    needed = set(lacking(resolved, have)) | {"-r"}
    return {
        n: v
        for n, (v, parents) in sorted(resolved.items())
        if n in have and have[n] is None and parents & needed
    }


def download_spares(spare: dict[str, str], py: str, wheels: Path, always: set[str]) -> list[str]:
    """Download ``spare``; keep the wheels up to ``SPARE_MAX_MIB``, and those named in ``always`` at any size."""
    with tempfile.TemporaryDirectory() as tmp:
        download(spare, py, Path(tmp))
        kept = []
        for wheel in sorted(Path(tmp).glob("*.whl")):
            if wheel.stat().st_size <= SPARE_MAX_MIB * 2**20 or norm(wheel.name.split("-", 1)[0]) in always:
                shutil.move(wheel, wheels / wheel.name)
                kept.append(norm(wheel.name.split("-", 1)[0]))
    return kept


def download(pins: dict[str, str], py: str, dest: Path) -> None:
    """cp``py`` manylinux x86_64 wheels (or pure-Python ones) of ``pins``, without their dependencies."""
    if not pins:
        return
    platforms = [arg for p in PIP_PLATFORMS for arg in ("--platform", p)]
    run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version", py,
         "--implementation", "cp", *platforms, "-d", str(dest), *(f"{n}=={v}" for n, v in pins.items())],
    )  # fmt: skip


def record_line(name: str, data: bytes) -> list[str]:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return [name, f"sha256={digest}", str(len(data))]


def strip_elf(data: bytes) -> bytes:
    """``data`` (an ELF shared object or executable) without symbols or debug sections."""
    with tempfile.NamedTemporaryFile(suffix=".so") as tmp:
        tmp.write(data)
        tmp.flush()
        run(["strip", "--strip-unneeded", tmp.name])
        return Path(tmp.name).read_bytes()


def rewrite_wheel(path: Path, drop: tuple[str, ...] = (), strip: bool = False) -> tuple[int, int]:
    """Rewrite ``path`` uncompressed, without entries under ``drop``, ELF files stripped when ``strip``, and a
    ``RECORD`` that lists what is left with its new hashes. Returns (entries dropped, ELF files stripped)."""
    dropped = stripped = 0
    files: list[tuple[zipfile.ZipInfo, bytes]] = []
    record_name = ""
    with zipfile.ZipFile(path) as src:
        for info in src.infolist():
            if info.filename.endswith(".dist-info/RECORD"):
                record_name = info.filename
                continue
            if info.filename.startswith(drop):
                dropped += 1
                continue
            data = src.read(info)
            if strip and data[:4] == b"\x7fELF":
                data, stripped = strip_elf(data), stripped + 1
            files.append((info, data))
    rows = [record_line(info.filename, data) for info, data in files if not info.is_dir()]
    text = io.StringIO()
    csv.writer(text, lineterminator="\n").writerows([*rows, [record_name, "", ""]])
    tmp = path.with_suffix(".tmp")
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_STORED) as out:
        for info, data in files:
            info.compress_type = zipfile.ZIP_STORED
            out.writestr(info, data)
        out.writestr(record_name, text.getvalue())
    tmp.replace(path)
    return dropped, stripped


def assumptions(wheels: Path, have: dict[str, str | None]) -> list[str]:
    """What the bundled wheels require of packages the target has at an unknown version (``name`` lines of
    ``--have``): ``X>=1.2 (by Y)``, the checks the install's pip makes there. Optional extras' lines are skipped."""
    found = []
    for wheel in sorted(wheels.glob("*.whl")):
        with zipfile.ZipFile(wheel) as whl:
            meta = next(n for n in whl.namelist() if n.endswith(".dist-info/METADATA"))
            lines = whl.read(meta).decode().splitlines()
        for line in lines:
            if not line.startswith("Requires-Dist:") or "extra ==" in line:
                continue
            spec = line.removeprefix("Requires-Dist:").strip()
            name = norm(re.split(r"[\s\[<>=!~;(]", spec, maxsplit=1)[0])
            if name in have and have[name] is None and re.search(r"[<>=!~]", spec.split(";")[0]):
                found.append(f"  {spec}   (by {wheel.name.split('-')[0]})")
    return found


def build_roll_wheels(dest: Path) -> None:
    """The four roll wheels the bundle installs (agentic and diffusion need packages a GPU check does not)."""
    everything = dest / "all"
    run(["uv", "build", "-q", "--all-packages", "--wheel", "--out-dir", str(everything)], cwd=ROOT)
    for wheel in everything.glob("*.whl"):
        if norm(wheel.name.split("-", 1)[0]) in ROLL_MEMBERS:
            shutil.copy2(wheel, dest / wheel.name)
    shutil.rmtree(everything)


def pack(stage: Path, out: Path, preset: int) -> None:
    """``stage``'s contents as ``out`` (.tar.xz at ``preset``)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    with (
        lzma.open(tmp, "wb", preset=preset) as xz,
        tarfile.open(fileobj=xz, mode="w") as tar,
    ):
        for path in sorted(stage.rglob("*")):
            tar.add(path, arcname=str(path.relative_to(stage)), recursive=False)
    tmp.replace(out)


def mib(n: float) -> str:
    return f"{n / 2**20:.1f} MiB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", required=True, help="target CPython version, e.g. 3.12")
    parser.add_argument(
        "--have", type=Path, required=True, help="packages the target has: name[==version] lines"
    )
    parser.add_argument("--out", type=Path, required=True, help="the .tar.xz to write")
    parser.add_argument(
        "--spare", action="append", default=[], help="carry this spare whatever its size (repeatable)"
    )
    parser.add_argument("--xz-preset", type=int, default=9, help="0-9: 9 packs smallest, lower ones faster")
    parser.add_argument("--limit-mib", type=float, default=60.0, help="fail when the bundle is larger")
    args = parser.parse_args()
    have = read_have(args.have)
    with tempfile.TemporaryDirectory(prefix="roll-bundle-") as tmp:
        work, stage = Path(tmp), Path(tmp) / "stage"
        wheels = stage / "wheels"
        wheels.mkdir(parents=True)
        build_roll_wheels(wheels)
        # Twice: the first pass finds what the target lacks and what of its own the bundle leans on; the second
        # pins exactly those to uv.lock (pinning the rest would fight the target's own versions: its torch's CUDA
        # libraries are not the lock's).
        first = resolve(work, args.python, have, wheels, locked=set())
        assert first is not None  # resolve returns None only when something is locked
        locked = set(lacking(first, have)) | set(leaned_on(first, have))
        resolved = resolve(work, args.python, have, wheels, locked=locked) or first
        missing = {n: v for n, v in lacking(resolved, have).items() if n not in ROLL_MEMBERS}
        spare = leaned_on(resolved, have)
        print(
            f"target cp{args.python.replace('.', '')}: {len(resolved)} packages resolved, {len(missing)} lacking, "
            f"{len(spare)} of the target's own leaned on"
        )
        download(missing, args.python, wheels)
        kept_spare = download_spares(spare, args.python, wheels, {norm(n) for n in args.spare})
        manifest = [f"roll GPU bundle for CPython {args.python} manylinux x86_64, built from uv.lock", ""]
        manifest += [f"{'wheel':70} {'MiB':>7}  sha256 as downloaded (or built)"]
        for wheel in sorted(wheels.glob("*.whl")):
            digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
            manifest.append(f"{wheel.name:70} {wheel.stat().st_size / 2**20:7.2f}  {digest}")
        raw = sum(w.stat().st_size for w in wheels.glob("*.whl"))
        for wheel in wheels.glob("*.whl"):
            is_ray = norm(wheel.name.split("-", 1)[0]) == "ray"
            dropped, stripped = rewrite_wheel(wheel, RAY_DROPPED if is_ray else (), strip=is_ray)
            if is_ray:
                manifest += ["", f"{wheel.name}: {dropped} entries under {', '.join(RAY_DROPPED)} dropped, "
                             f"{stripped} ELF files stripped, RECORD rewritten"]  # fmt: skip
        trusted = sorted(n for n in have if n in resolved)
        manifest += ["", "left to the target (it has them): " + ", ".join(trusted)]
        manifest += ["spare wheels of the target's own, used only where its version does not satisfy: "]
        manifest[-1] += ", ".join(kept_spare) or "none"
        manifest += ["requirements on the target's packages of unknown version (its pip checks them):"]
        manifest += assumptions(wheels, have)
        manifest += ["all wheels re-zipped uncompressed so that xz compresses their contents"]
        (stage / "MANIFEST.txt").write_text("\n".join(manifest) + "\n")
        roll_version = {n: v for n, (v, _) in resolved.items() if n in ROLL_MEMBERS}
        (stage / "requirements.txt").write_text(
            "".join(f"{r}=={roll_version[norm(r.split('[')[0])]}\n" for r in REQUIREMENTS)
        )
        pack(stage, args.out, args.xz_preset)
        print("\n".join(manifest))
        size = args.out.stat().st_size
        print(
            f"\n{args.out}: {mib(size)} ({len(list(wheels.glob('*.whl')))} wheels, {mib(raw)} as downloaded)"
        )
    if size > args.limit_mib * 2**20:
        sys.exit(f"bundle: {args.out} is {mib(size)}, over --limit-mib {args.limit_mib:g}")


if __name__ == "__main__":
    main()
