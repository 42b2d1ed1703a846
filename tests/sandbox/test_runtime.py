"""The box's runtime (its Python and site-packages, copied where slot uids can reach them) is named by what it was
copied from: a changed site gets a fresh copy, an unchanged one is found again, however it was changed."""

from __future__ import annotations

import os
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
