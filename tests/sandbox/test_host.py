"""Host checks that need no box: what `farmctl doctor` says about core dumps."""

from __future__ import annotations

from pathlib import Path

import pytest

from farmd.sandbox import host


@pytest.mark.parametrize(("pattern", "ok"), [
    ("core", True),
    ("/var/crash/core.%e.%p", True),
    ("|/usr/lib/systemd/systemd-coredump %P %u %g %s %t %c %h", True),
    ("|/usr/share/apport/apport -p%p -s%s -c%c -d%d -P%P -u%u -g%g -- %E", True),
    ("@/run/systemd/coredump.socket", False),
    ("@@/run/systemd/coredump.socket", False),
])
def test_core_dump_check(tmp_path: Path, pattern: str, ok: bool) -> None:
    """A file or a pipe helper is kept from box crashes by their core limit of 1; a socket pattern
    (Linux 6.16+) ignores the limit, so the host cannot keep a box's crash from the service behind it."""
    path = tmp_path / "core_pattern"
    path.write_text(pattern + "\n")
    check = host._check_core_dumps(str(path))
    assert check.ok is ok, check
    assert check.name == "core dumps"
    if not ok:
        assert "socket" in check.detail and check.fix


def test_core_dump_check_fails_when_the_pattern_cannot_be_read(tmp_path: Path) -> None:
    check = host._check_core_dumps(str(tmp_path / "absent"))
    assert not check.ok and check.fix
