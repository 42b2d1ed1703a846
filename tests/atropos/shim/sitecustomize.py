"""Loaded by every Python started with this directory on PYTHONPATH (atroposlib's API tests and the servers
they launch): ``python -m atroposlib.cli.run_api`` runs farm's launcher instead, which starts farmd's Atropos
API on the same host and port. Nothing else of atroposlib changes."""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from pathlib import Path

_LAUNCHER = Path(__file__).with_name("farm_run_api.py")


class _PointAtFarmd(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):  # type: ignore[no-untyped-def]
        if fullname == "atroposlib.cli.run_api":
            return importlib.util.spec_from_file_location(fullname, _LAUNCHER)
        return None


sys.meta_path.insert(0, _PointAtFarmd())
