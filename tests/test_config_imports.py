"""Loading the config is cheap: every farmd and farmctl start does it, most never touch the scheduler."""

from __future__ import annotations

import json
import subprocess
import sys


def test_importing_the_config_loads_no_scheduler_store_or_metrics() -> None:
    code = ("import json, sys, farmd.config; print(json.dumps(sorted(m for m in sys.modules if m.startswith("
            "('farmd.scheduler.scheduler', 'farmd.scheduler.delivery', 'farmd.scheduler.policies', 'farmd.store', "
            "'farmd.metrics', 'prometheus_client')))))")
    # A fresh interpreter: this one has long since imported everything.
    loaded = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, check=True,
                                       text=True).stdout)
    assert loaded == []


def test_farmctl_starts_without_agents_environments_or_boxes() -> None:
    # Scripts (and this suite) start farmctl hundreds of times; each command loads what it runs.
    code = ("import json, sys, farmd.cli.farmctl, farmd.cli.remote_cmd; print(json.dumps(sorted(m for m in sys.modules "
            "if m.startswith(('farmd.agents', 'farmd.envs', 'farmd.sandbox.runner', 'farmd.intake.checks', 'torch')))))")
    loaded = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, check=True,
                                       text=True).stdout)
    assert loaded == []
