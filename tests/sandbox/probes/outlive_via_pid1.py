"""Probe: outlive the program's own end by stalling the box's pid 1 (bwrap's init).

pid 1 reaps the box's processes and tells bwrap's monitor outside when the init
(our parent) ends; the box ends when pid 1 does. If this program may write pid 1's
memory (/proc/1/mem), it plants a pause loop where pid 1's wait() returns, leaves a
child running, and exits normally after argv[1] seconds: the init then reports a
genuine exit to the host, but pid 1 never ends, so neither does the box.

The child prints "beat <seconds since the program started>" every 50 ms, so the
result's stdout says how long a process of the box ran.
"""

import os
import sys
import time

started = time.monotonic()
if os.fork() == 0:  # the payload that wants to outlive the program
    while True:
        print(f"beat {time.monotonic() - started:.3f}", flush=True)
        time.sleep(0.05)

time.sleep(float(sys.argv[1]))
try:
    fields = ["-1"]
    deadline = time.monotonic() + 0.5
    while fields[0] != "61" and time.monotonic() < deadline:  # pid 1 blocks in wait4 (61)
        with open("/proc/1/syscall") as fh:
            fields = fh.read().split()
    pc = int(fields[-1], 16)
    pause_loop = b"\xb8\x22\x00\x00\x00" + b"\x0f\x05" + b"\xeb\xf7"  # mov eax, 34 (pause); syscall; jmp back
    with open("/proc/1/mem", "r+b", buffering=0) as mem:
        mem.seek(pc)
        mem.write(pause_loop)
    print(f"pid 1 stalled at {pc:#x}", flush=True)
except Exception as exc:  # the box held
    print(f"could not stall pid 1: {exc!r}", file=sys.stderr, flush=True)
