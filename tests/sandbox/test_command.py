"""Policy + layout -> bwrap command line: a pure function, checked without running anything."""

from __future__ import annotations

import dataclasses

import pytest

from farmd.sandbox import command
from farmd.sandbox.command import BoxFds, HostLayout
from farmd.sandbox.policy import SandboxPolicy

LAYOUT = HostLayout(
    bwrap="/run/farm/runtime/bwrap-x/bwrap",
    ro_binds=(("/usr", "/usr"), ("/run/farm/runtime/empty", "/usr/local")),
    symlinks=(("usr/bin", "/bin"), ("usr/lib", "/lib")),
    etc_dir="/run/farm/runtime/etc",
    runtime_dir="/run/farm/runtime/box-x",
)
FDS = BoxFds(info=10, block=11, seccomp=12, control=13)


def _pairs(args: list[str], flag: str, n: int) -> list[tuple[str, ...]]:
    return [tuple(args[i + 1 : i + 1 + n]) for i, a in enumerate(args) if a == flag]


def test_every_namespace_and_no_nested_userns() -> None:
    args = command.bwrap_args(SandboxPolicy(), LAYOUT, "/run/farm/boxes/1-0", FDS)
    for flag in ("--unshare-user", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
                 "--disable-userns", "--die-with-parent", "--new-session"):
        assert flag in args, flag
    assert "--share-net" not in args
    assert args.index("--unshare-user") < args.index("--disable-userns")
    assert _pairs(args, "--cap-drop", 1) == [("ALL",)]
    assert _pairs(args, "--uid", 1) == [(str(command.BOX_UID),)]


def test_filesystem_is_minimal_and_read_only() -> None:
    args = command.bwrap_args(SandboxPolicy(), LAYOUT, "/run/farm/boxes/1-0", FDS)
    ro = _pairs(args, "--ro-bind", 2)
    assert ("/run/farm/runtime/etc", "/etc") in ro
    assert ("/run/farm/runtime/box-x", command.BOX_RUNTIME) in ro
    assert ro.index(("/usr", "/usr")) < ro.index(("/run/farm/runtime/empty", "/usr/local"))
    # The only writable host bind is the box's own scratch directory.
    assert _pairs(args, "--bind", 2) == [("/run/farm/boxes/1-0", command.BOX_WORKDIR)]
    assert not any(src in ("/", "/home", "/root", "/etc", "/run", "/tmp") for src, _ in ro)
    # Device binds: only harmless character devices.
    assert {src for src, _ in _pairs(args, "--dev-bind", 2)} == {"/dev/null", "/dev/zero", "/dev/urandom"}
    root_ro = max(i for i, a in enumerate(args) if a == "--remount-ro")
    assert args[root_ro + 1] == "/"
    assert root_ro > max(i for i, a in enumerate(args) if a in ("--bind", "--ro-bind"))
    assert _pairs(args, "--chdir", 1) == [(command.BOX_WORKDIR,)]


def test_tmpfs_sizes_come_from_the_policy() -> None:
    args = command.bwrap_args(SandboxPolicy(tmp_mb=3, shm_mb=2), LAYOUT, "/s", FDS)
    # --size BYTES --tmpfs DEST
    sizes = {args[i + 3]: int(args[i + 1]) for i, a in enumerate(args) if a == "--size"}
    assert all(args[i + 2] == "--tmpfs" for i, a in enumerate(args) if a == "--size")
    assert sizes["/dev/shm"] == 2 * 2**20 and sizes["/tmp"] == 3 * 2**20
    assert sizes["/dev"] <= 2**20  # device nodes and links only


def test_descriptors_and_environment() -> None:
    args = command.bwrap_args(SandboxPolicy(env=(("SEED", "7"),)), LAYOUT, "/s", FDS)
    assert _pairs(args, "--seccomp", 1) == [("12",)]
    assert _pairs(args, "--info-fd", 1) == [("10",)]
    assert _pairs(args, "--block-fd", 1) == [("11",)]
    env = dict(_pairs(args, "--setenv", 2))  # type: ignore[arg-type]
    assert env["SEED"] == "7" and env["HOME"] == command.BOX_WORKDIR and env["PATH"] == command.BOX_PATH
    assert not any(k.startswith(("FARM", "LD_", "SSH", "AWS")) for k in env)


def test_host_paths_stay_out_of_the_visible_argv() -> None:
    argv = command.launch_argv(LAYOUT, 2_000_000_001, 2_000_000_001, 5, 6, 7)
    assert argv[:5] == ["/usr/bin/setpriv", "--reuid=2000000001", "--regid=2000000001", "--clear-groups", "--"]
    bwrap = argv[5:]
    assert bwrap[:4] == [LAYOUT.bwrap, "--args", "5", "--"]
    visible = " ".join(bwrap[1:])
    for host_path in ("/run/farm/boxes", "/run/farm/runtime/etc", LAYOUT.runtime_dir):
        assert host_path not in visible
    assert bwrap[4:8] == [command.BOX_INIT_PYTHON, "-I", "-S", "-B"]


def test_args_payload_is_nul_separated_and_refuses_nul() -> None:
    assert command.args_payload(["--a", "b"]) == b"--a\0b\0"
    with pytest.raises(ValueError):
        command.args_payload(["a\0b"])


def test_unprivileged_launch_has_no_setpriv() -> None:
    layout = HostLayout(**{**{f: getattr(LAYOUT, f) for f in LAYOUT.__slots__}, "setpriv": None})  # type: ignore[arg-type]
    assert command.launch_argv(layout, 1, 1, 5, 6, 7)[0] == LAYOUT.bwrap


def test_proc_is_masked_and_read_only() -> None:
    masks = (("/run/farm/runtime/proc-x/empty", "/proc/cmdline"), ("/run/farm/runtime/empty", "/proc/acpi"),
             ("/run/farm/runtime/proc-x/boot_id", "/proc/sys/kernel/random/boot_id"))
    layout = dataclasses.replace(LAYOUT, proc_masks=masks)
    args = command.bwrap_args(SandboxPolicy(), layout, "/s", FDS)
    proc_at = args.index("--proc")
    assert args[proc_at + 1] == "/proc"
    # Each mask is a read-only bind made after /proc is mounted (before, it would be covered by it).
    at = [i for i, a in enumerate(args) if a == "--ro-bind" and args[i + 2].startswith("/proc/")]
    assert [tuple(args[i + 1 : i + 3]) for i in at] == list(masks)
    assert min(at) > proc_at
    remounts = [args[i + 1] for i, a in enumerate(args) if a == "--remount-ro"]
    assert remounts == ["/proc", "/"]
    assert args.index("--remount-ro") > max(at)
    # Without masks (a kernel that shows none of those paths) /proc is still read-only.
    plain = command.bwrap_args(SandboxPolicy(), LAYOUT, "/s", FDS)
    assert [plain[i + 1] for i, a in enumerate(plain) if a == "--remount-ro"] == ["/proc", "/"]
