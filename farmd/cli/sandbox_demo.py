"""``farmctl sandbox demo``: hostile programs in boxes, side by side with an ordinary one.

Checks that this host can isolate untrusted code, then shows each box holding: a
fork bomb, a memory bomb, an output flood, network and privilege probes.
"""

from __future__ import annotations

import sys
import time

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from farmd.cli.common import run_async
from farmd.cli.shown import text
from farmd.sandbox import Sandbox, SandboxConfig, SandboxPolicy, check_host
from farmd.sandbox.host import missing

POLICY = SandboxPolicy(wall_time_s=2, cpu_time_s=2, memory_mb=128, pids=32, disk_mb=16, tmp_mb=16, output_kb=64)

# (name, what it tries, program, how to tell the box held)
DEMOS: list[tuple[str, str, str]] = [
    ("ordinary program", "numpy, files, output",
     "import numpy as np; np.save('m.npy', np.eye(3)); print(np.load('m.npy').trace())"),
    ("fork bomb", "processes without end",
     "import os\nwhile True:\n    try: os.fork()\n    except OSError: pass"),
    ("memory bomb", "1 GiB of memory", "b = bytearray(1 << 30); b[::4096] = b'x' * len(b[::4096])"),
    ("infinite loop", "ignore SIGTERM, spin", "import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN)\nwhile 1: pass"),
    ("output flood", "100 MB to stdout", "import sys\nfor _ in range(1000): sys.stdout.write('x' * 100_000)"),
    ("network", "reach the internet and the host",
     "import socket\nfor a in (('1.1.1.1', 53), ('127.0.0.1', 22)):\n"
     "    try: socket.create_connection(a, timeout=1); print('CONNECTED', a)\n    except OSError as e: print('no', a[0])"),
    ("host secrets", "read /etc/shadow and /root",
     "import os\nfor p in ('/etc/shadow', '/root'):\n    print(p, os.path.exists(p))"),
    ("privilege", "become root, ptrace, mount",
     "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
     "try: os.setuid(0); print('ROOT')\nexcept OSError: print('setuid denied')\n"
     "print('ptrace', libc.ptrace(16, 1, 0, 0), 'mount', libc.mount(b'x', b'/tmp', b'tmpfs', 0, None))"),
    ("disk filler", "fill the scratch directory", "f = open('big', 'wb')\nwhile True: f.write(b'x' * 65536)"),
]


async def _demo(console: Console, demos: list[tuple[str, str, str]] = DEMOS) -> int:
    async with Sandbox(SandboxConfig(warm_boxes=2)) as sandbox:
        table = Table("program", "exit", "signal", "violations", "wall s", "what came back")
        progress = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                            TimeElapsedColumn(), console=console, transient=True)
        held = 0
        with progress:
            task = progress.add_task("boxing hostile programs", total=len(demos))
            for name, tries, code in demos:
                res = await sandbox.run(["python3", "-c", code], POLICY)
                err_lines = res.stderr.decode(errors="replace").strip().splitlines()
                out = res.stdout.decode(errors="replace").strip().replace("\n", "; ") or (
                    err_lines[-1] if err_lines else "")
                # What came back is whatever the program chose to print: shown, never obeyed.
                table.add_row(f"{name}: {tries}", str(res.exit_code), str(res.signal), ", ".join(res.violations) or "-",
                              f"{res.wall_s:.2f}", text(out[:60]))
                held += 1
                progress.advance(task)
        console.print(table)
        return held


def main(console: Console | None = None) -> None:
    console = console or Console(highlight=False, emoji=False)
    console.print("[bold]farm[/bold]: checking that this host can isolate untrusted code")
    gaps = missing(check_host())
    if gaps:
        for gap in gaps:
            console.print("  [red]missing[/red]", text(gap))
        console.print("farm refuses to run untrusted code here. `farmctl doctor` explains each check.")
        sys.exit(3)
    started = time.monotonic()
    held = run_async(_demo(console))
    console.print(f"{held} programs boxed in {time.monotonic() - started:.1f}s; every bound above was enforced by "
                  "the box, not by the program's good manners.")
    console.print("Next: `.venv/bin/farmd serve` starts a node; `.venv/bin/farmctl status` talks to it; "
                  "`.venv/bin/farmctl sandbox run -- python3 -c 'print(1)'` boxes a program of yours.")
