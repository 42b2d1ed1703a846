"""The box's runtime (its Python and site-packages, copied where slot uids can reach them) is named by what it was
copied from: a changed site gets a fresh copy, an unchanged one is found again, however it was changed."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from farmd.sandbox.runtime import SITE_STAMP, box_runtime, ensure_run_dir


def _site(root: Path) -> Path:
    site = root / "site"
    (site / "site-packages" / "pkg").mkdir(parents=True)
    (site / "site-packages" / "pkg" / "__init__.py").write_text("A = 1\n")
    return site


def _runtime(run_dir: Path, site: Path) -> Path:
    return box_runtime(run_dir, Path("/usr/bin/python3"), site)


def test_a_site_without_a_stamp_is_known_by_every_file(tmp_path: Path) -> None:
    run_dir, site = tmp_path / "run", _site(tmp_path)
    ensure_run_dir(run_dir)
    first = _runtime(run_dir, site)
    assert (first / "site" / "site-packages" / "pkg" / "__init__.py").read_text() == "A = 1\n"
    assert _runtime(run_dir, site) == first, "an unchanged site is copied once"
    module = site / "site-packages" / "pkg" / "__init__.py"
    with open(module, "a") as fh:  # in place: the directories' times stay as they were
        fh.write("B = 2\n")
    changed = _runtime(run_dir, site)
    assert changed != first and (changed / "site" / "site-packages" / "pkg" / "__init__.py").read_text().endswith(
        "B = 2\n")


def test_a_built_site_is_known_by_its_stamp_and_its_directories(tmp_path: Path) -> None:
    run_dir, site = tmp_path / "run", _site(tmp_path)
    ensure_run_dir(run_dir)
    (site / SITE_STAMP).write_text("build-1\n")
    first = _runtime(run_dir, site)
    assert _runtime(run_dir, site) == first
    (site / SITE_STAMP).write_text("build-2\n")
    rebuilt = _runtime(run_dir, site)
    assert rebuilt != first, "a new build of the site is a new runtime"
    before = (site / "site-packages").stat().st_mtime_ns
    (site / "site-packages" / "extra.py").write_text("C = 3\n")  # an install by hand, into the built site
    os.utime(site / "site-packages", ns=(before + 1_000_000, before + 1_000_000))  # coarse clocks: a later time
    by_hand = _runtime(run_dir, site)
    assert by_hand != rebuilt and (by_hand / "site" / "site-packages" / "extra.py").read_text() == "C = 3\n"


_HOLDER = """
import sys
from pathlib import Path
from farmd.sandbox.runtime import box_runtime
print(box_runtime(Path(sys.argv[1]), Path("/usr/bin/python3"), Path(sys.argv[2])), flush=True)
sys.stdin.read()  # held until the test closes its stdin
"""


def _holder(run_dir: Path, site: Path) -> tuple[subprocess.Popen[str], Path]:
    """A farm process that uses the runtime of ``site`` until its stdin closes."""
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER, str(run_dir), str(site)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[2])
    assert proc.stdout is not None
    return proc, Path(proc.stdout.readline().strip())


def test_a_build_sweeps_away_the_runtimes_no_process_holds(tmp_path: Path) -> None:
    """Every install of farm is a new runtime (~700 MB): one left by a farm no longer running goes when the next is
    built, as does a half-built copy of a build that was killed; one a live farm process uses stays."""
    run_dir, site = tmp_path / "run", _site(tmp_path)
    ensure_run_dir(run_dir)
    builds = iter(range(100))

    def rebuilt() -> Path:
        (site / SITE_STAMP).write_text(f"build-{next(builds)}\n")
        return site

    live, live_runtime = _holder(run_dir, rebuilt())
    gone, gone_runtime = _holder(run_dir, rebuilt())
    try:
        gone.communicate("", timeout=30)
        killed_build = run_dir / "runtime" / "box-0123456789abcdef.tmp999"
        killed_build.mkdir()
        assert live_runtime.is_dir() and gone_runtime.is_dir()
        mine = _runtime(run_dir, rebuilt())
        assert mine.is_dir() and live_runtime.is_dir(), "a runtime in use was swept"
        assert not gone_runtime.exists() and not killed_build.exists()
        # Renamed away at once, removed by a thread of the sweeping process: nothing of them is left.
        deadline = time.monotonic() + 30
        while [p for p in (run_dir / "runtime").iterdir() if p.name.startswith(".trash-")]:
            assert time.monotonic() < deadline, list((run_dir / "runtime").iterdir())
            time.sleep(0.05)
    finally:
        live.communicate("", timeout=30)
    _holder(run_dir, rebuilt())[0].communicate("", timeout=30)
    assert not live_runtime.exists(), "the runtime of a farm that stopped is swept at the next build"
    assert mine.is_dir(), "this process still holds its own"
