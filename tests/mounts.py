"""Faults the kernel itself injects: a real tmpfs, read-only (EROFS) or small enough to fill (ENOSPC),
refused to whoever writes, root included."""

from __future__ import annotations

import subprocess
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def tmpfs(mount: Path, options: str):
    """A tmpfs mounted at ``mount`` (created) with ``options`` (e.g. "ro,size=1m", "size=64m"),
    unmounted on exit. Skips the test where this machine refuses the mount."""
    mount.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mount)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)
