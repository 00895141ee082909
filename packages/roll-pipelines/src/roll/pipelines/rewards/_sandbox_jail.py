"""The filesystem jail of the code sandbox: a mount namespace whose root shows only what the interpreter needs.

Runs as a short ``sh`` script inside ``unshare --mount --pid --net --fork`` (util-linux only, no bubblewrap):

- the new root is a 1 MiB tmpfs mounted over ``<workdir>/root`` (the mount vanishes with the namespace);
- ``/usr`` and the interpreter's prefix (when it lives elsewhere) are bind-mounted **read-only**; ``/bin``,
  ``/lib``, ``/lib64``, ``/sbin`` are recreated as the host has them (symlinks into ``/usr`` on merged-usr
  systems, read-only binds otherwise); of ``/etc`` only the dynamic loader's cache and the time zone; of ``/dev``
  only ``null``, ``zero``, ``random`` and ``urandom``;
- the program's working dir ``/sandbox`` (also ``HOME`` and ``TMPDIR``) and ``/tmp`` are private, size-capped
  tmpfs; ``/proc`` is a fresh mount, so it lists the pid namespace's processes only;
- then ``unshare --root`` chroots into it and changes to ``/sandbox``; the bootstrap drops to the sandbox uid
  (in ``test`` mode after forking the harness off, see :mod:`._sandbox_boot`).

Nothing else of the host (data folders, checkouts, home directories, the host's ``/tmp``) exists inside.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

SANDBOX_DIR = "/sandbox"
_TOP_DIRS = ("bin", "lib", "lib64", "sbin")
_ETC_FILES = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/localtime")
_DEVICES = ("null", "zero", "random", "urandom")


def _bind_ro(src: str, dst: str) -> list[str]:
    return [f"mkdir -p {dst}", f"mount --bind -o ro {src} {dst}"]


def _top_dir_lines() -> list[str]:
    lines: list[str] = []
    for name in _TOP_DIRS:
        host = Path("/") / name
        if host.is_symlink():
            lines.append(f"ln -s {shlex.quote(os.readlink(host))} {name}")
        elif host.is_dir():
            lines += _bind_ro(shlex.quote(str(host)), name)
    return lines


def _extra_prefixes(python: str) -> list[str]:
    """The interpreter's install prefix when it is not under ``/usr`` (pyenv, uv-managed, conda)."""
    real = Path(python).resolve()
    prefix = real.parent.parent  # <prefix>/bin/python3.x
    if str(real).startswith("/usr/"):
        return []
    return [str(prefix)]


def jail_script(python: str, uid: int | None) -> str:
    """``sh -c`` text; positional args: ``$1`` host workdir, ``$2`` tmpfs size (MiB), then the program's argv."""
    q = shlex.quote
    lines = [
        "set -e",
        'W=$1; SIZE=$2; shift 2; R="$W/root"',
        'mount -t tmpfs -o mode=0755,size=1m roll-root "$R"',
        'cd "$R"',
        "mkdir usr etc dev proc tmp sandbox",
        *_bind_ro("/usr", "usr"),
        *_top_dir_lines(),
    ]
    for prefix in _extra_prefixes(python):
        lines += _bind_ro(q(prefix), q("." + prefix))
    for path in _ETC_FILES:
        if Path(path).is_file():
            lines += [f"touch .{path}", f"mount --bind -o ro {path} .{path}"]
    for dev in _DEVICES:
        lines += [f"touch dev/{dev}", f"mount --bind /dev/{dev} dev/{dev}"]
    lines += [
        'mount -t tmpfs -o "size=${SIZE}m,mode=1777,noexec,nosuid,nodev" roll-tmp tmp',
        'mount -t tmpfs -o "size=${SIZE}m,mode=0755,noexec,nosuid,nodev" roll-cwd sandbox',
        'cp "$W/program.py" "$W/_boot.py" "$W/_guard.py" sandbox/',
    ]
    if uid is not None:
        lines.append(f"chown -R {uid}:{uid} sandbox")
    lines += ["mount -t proc proc proc", f'exec unshare --root="$R" --wd={SANDBOX_DIR} "$@"']
    return "\n".join(lines)
