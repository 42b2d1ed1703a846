"""What a box's /proc does not show of the host.

A box mounts a /proc of its own pid namespace, but much of procfs is the whole
kernel's: the host's boot command line and boot id, the kernel's build config and
symbols, its timers, interrupts and hardware. Container runtimes mask a list of
these (``MaskedPaths`` in Docker's and containerd's defaults); farm masks that list
and the host's identity besides, and mounts the whole of /proc read-only (their
``ReadonlyPaths``, /proc/sys among them, are inside it).

A mask is a read-only bind: an empty file or directory over the path, or for the
boot id a fixed one that says nothing about the host. A bind needs its target to
exist, so only paths this kernel has are masked; every box runs on the host's
kernel, so the host's /proc says which. Nor is a file masked that only its owner
and group may read: procfs files belong to the host's root, and a box's processes
are neither that user nor in its group (kcore, and timer_list on recent kernels,
are such); nor a directory that lists nothing (/proc/acpi on most modern kernels).
Each mask costs every box's start about a tenth of a millisecond (a bind and a pass
of bwrap over the mount table), which is why the list is what shows the host, not
everything procfs has. What runtimes make read-only (/proc/sys, sysrq-trigger, bus,
fs, irq) is read-only with the rest of /proc (``command.bwrap_args``).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable

HIDDEN_FILES: dict[str, str] = {
    # What container runtimes mask.
    "kcore": "the kernel's memory, as a core file",
    "keys": "keyrings",
    "latency_stats": "kernel latency statistics",
    "timer_list": "every timer on the host, with kernel addresses",
    "timer_stats": "timer statistics of every process",
    "sched_debug": "the scheduler's view of every task on the host",
    "interrupts": "the host's interrupt counts: a side channel on other boxes' activity",
    # The host's identity and its kernel's internals.
    "cmdline": "the host's boot command line",
    "config.gz": "the kernel's build configuration",
    "kallsyms": "the kernel's symbols",
    "modules": "the kernel modules loaded on the host",
    "sys/kernel/core_pattern": "the host's core-dump helper",
}
"""Files under /proc that read as empty in a box, each with what it would show."""

HIDDEN_DIRS: dict[str, str] = {
    "acpi": "the host's ACPI tables and devices",
    "asound": "the host's sound cards",
    "scsi": "the host's SCSI devices",
    "bus": "the host's PCI and input devices",
}
"""Directories under /proc that list as empty in a box."""

BOOT_ID = "sys/kernel/random/boot_id"
BOX_BOOT_ID = "00000000-0000-4000-8000-000000000000"
"""What a box reads as its boot id: well-formed, the same in every box, and not the host's, which
would tell two boxes they share a machine and outlive the box as an identity of the host."""


def readable_by_a_box(path: str) -> bool:
    """True if ``path`` exists on the host and its mode lets anyone but its owner and group read it."""
    try:
        return bool(os.stat(path).st_mode & stat.S_IROTH)
    except OSError:
        return False


def holds_anything(path: str) -> bool:
    """True if the directory ``path`` lists anything (an empty one needs no mask)."""
    try:
        return bool(os.listdir(path))
    except OSError:
        return False


def masks(empty_file: str, empty_dir: str, boot_id_file: str,
          readable: Callable[[str], bool] = readable_by_a_box,
          not_empty: Callable[[str], bool] = holds_anything) -> tuple[tuple[str, str], ...]:
    """(host path, box path) pairs to bind read-only over the box's /proc, for what a box could read.

    ``readable`` and ``not_empty`` are asked about the host's /proc paths (the box runs on the
    same kernel, whose procfs lists the same entries there).
    """
    pairs: list[tuple[str, str]] = []
    for name in HIDDEN_FILES:
        if readable(f"/proc/{name}"):
            pairs.append((empty_file, f"/proc/{name}"))
    for name in HIDDEN_DIRS:
        if readable(f"/proc/{name}") and not_empty(f"/proc/{name}"):
            pairs.append((empty_dir, f"/proc/{name}"))
    if readable(f"/proc/{BOOT_ID}"):
        pairs.append((boot_id_file, f"/proc/{BOOT_ID}"))
    return tuple(pairs)
