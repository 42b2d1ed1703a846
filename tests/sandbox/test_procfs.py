"""What of /proc a box does not see: the mask list as data, checked without running a box."""

from __future__ import annotations

import uuid

from farmd.sandbox import procfs

# Docker's, containerd's and Kubernetes' default MaskedPaths under /proc: farm's list must hold them all.
RUNTIME_MASKED = ("acpi", "asound", "interrupts", "kcore", "keys", "latency_stats", "timer_list", "timer_stats",
                  "sched_debug", "scsi")


def test_the_container_runtime_floor_and_the_hosts_identity_are_masked() -> None:
    hidden = set(procfs.HIDDEN_FILES) | set(procfs.HIDDEN_DIRS)
    assert set(RUNTIME_MASKED) <= hidden
    assert {"cmdline", "config.gz", "kallsyms", "modules"} <= hidden
    assert all(why for why in [*procfs.HIDDEN_FILES.values(), *procfs.HIDDEN_DIRS.values()])


def test_only_what_a_box_could_read_is_masked() -> None:
    """Each mask costs every box's start a bind: what it could not read, or an empty directory, needs none."""
    readable = {"/proc/cmdline", "/proc/acpi", "/proc/bus", "/proc/sys/kernel/random/boot_id"}
    pairs = procfs.masks("E", "D", "B", readable=readable.__contains__, not_empty="/proc/bus".__eq__)
    assert pairs == (("E", "/proc/cmdline"), ("D", "/proc/bus"), ("B", "/proc/sys/kernel/random/boot_id"))
    assert procfs.masks("E", "D", "B", readable=lambda path: False, not_empty=lambda path: True) == ()


def test_holds_anything(tmp_path) -> None:  # type: ignore[no-untyped-def]
    assert not procfs.holds_anything(str(tmp_path))
    (tmp_path / "x").mkdir()
    assert procfs.holds_anything(str(tmp_path))
    assert not procfs.holds_anything(str(tmp_path / "absent"))


def test_readable_by_a_box_reads_the_mode(tmp_path) -> None:  # type: ignore[no-untyped-def]
    private = tmp_path / "private"
    private.write_text("x")
    private.chmod(0o640)
    public = tmp_path / "public"
    public.write_text("x")
    public.chmod(0o444)
    assert not procfs.readable_by_a_box(str(private))
    assert procfs.readable_by_a_box(str(public))
    assert not procfs.readable_by_a_box(str(tmp_path / "absent"))


def test_the_box_boot_id_is_well_formed() -> None:
    assert str(uuid.UUID(procfs.BOX_BOOT_ID)) == procfs.BOX_BOOT_ID
