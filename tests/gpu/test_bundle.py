"""tests/gpu/bundle.py's own logic, without a network: what a target lacks, what it is leaned on for, the
``--have`` file, and a rewritten wheel whose ``RECORD`` still matches every file (pip and ``wheel`` check it)."""

from __future__ import annotations

import base64
import csv
import hashlib
import importlib.util
import io
import zipfile
from pathlib import Path
from types import ModuleType


def _bundle() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_bundle", Path(__file__).with_name("bundle.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


B = _bundle()

# A resolution as `uv pip compile --annotation-style line` gives it: name -> (version, parents); "-r" = top level.
RESOLVED = {
    "roll-core": ("0.1.0", {"-r"}),
    "ray": ("2.60.0", {"roll-core"}),
    "jsonschema": ("4.26.0", {"ray"}),
    "torch": ("2.11.0", {"roll-core"}),
    "nvidia-nccl-cu13": ("2.28.9", {"torch"}),  # reached only through the target's torch
    "packaging": ("26.4", {"ray", "torch"}),
    "tqdm": ("4.70.1", {"torch"}),  # the target has it, but only torch needs it
    "numpy": ("2.5.2", {"roll-core"}),
}
HAVE = {"torch": "2.11.0", "numpy": "2.5.2", "packaging": None, "tqdm": None}


def test_lacking_stops_at_what_the_target_has() -> None:
    # roll-core (top level), ray (needed by roll-core), jsonschema (by ray); torch and numpy are the target's, and
    # nvidia-nccl is needed only through torch, so the target's torch already brings its own.
    assert B.lacking(RESOLVED, HAVE) == {"jsonschema": "4.26.0", "ray": "2.60.0", "roll-core": "0.1.0"}


def test_leaned_on_names_the_targets_packages_of_unknown_version_that_bundled_ones_need() -> None:
    # packaging: unknown version, needed by ray (bundled) -> a spare. tqdm: unknown version but needed only by the
    # target's torch -> none. numpy: needed by roll-core, but its version is known (and steered the resolution).
    assert B.leaned_on(RESOLVED, HAVE) == {"packaging": "26.4"}


def test_read_have_normalizes_names_and_drops_local_labels(tmp_path: Path) -> None:
    have = tmp_path / "have.txt"
    have.write_text(
        "# the image\nTorch==2.13.0+cpu\ntyping_extensions\n\n-e ./local\nPyYAML==6.0.4  # pinned\n"
    )
    assert B.read_have(have) == {"torch": "2.13.0", "typing-extensions": None, "pyyaml": "6.0.4"}


def _record_of(files: dict[str, bytes]) -> str:
    text = io.StringIO()
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        csv.writer(text, lineterminator="\n").writerow([name, f"sha256={digest}", len(data)])
    return text.getvalue() + "pkg-1.0.dist-info/RECORD,,\n"


def test_rewrite_wheel_drops_parts_stores_uncompressed_and_keeps_record_true(tmp_path: Path) -> None:
    files = {
        "pkg/__init__.py": b"x = 1\n" * 100,
        "pkg/rllib/big.py": b"y = 2\n" * 1000,
        "pkg/tool.sh": b"#!/bin/sh\necho hi\n",
        "pkg-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: pkg\nVersion: 1.0\n",
    }
    wheel = tmp_path / "pkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name, data in files.items():
            info = zipfile.ZipInfo(name)
            info.external_attr = (0o755 if name.endswith(".sh") else 0o644) << 16
            zf.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED)
        zf.writestr("pkg-1.0.dist-info/RECORD", _record_of(files))

    dropped, stripped = B.rewrite_wheel(wheel, drop=("pkg/rllib/",))

    assert (dropped, stripped) == (1, 0)
    kept = {k: v for k, v in files.items() if not k.startswith("pkg/rllib/")}
    with zipfile.ZipFile(wheel) as zf:
        assert sorted(zf.namelist()) == sorted([*kept, "pkg-1.0.dist-info/RECORD"])
        assert {i.compress_type for i in zf.infolist()} == {zipfile.ZIP_STORED}
        assert zf.getinfo("pkg/tool.sh").external_attr >> 16 == 0o755  # executables stay executable
        record = zf.read("pkg-1.0.dist-info/RECORD").decode()
        for name, data in kept.items():
            assert zf.read(name) == data
    assert record == _record_of(kept)  # every kept file with its true hash and size; the dropped one gone
