"""Probe: crash box processes every way that asks the kernel for a core dump, after trying to re-enable one.

A crash that dumps core hands the process's memory to whatever ``kernel.core_pattern`` names: a file, or
a helper the kernel starts on the host as root. Prints one JSON object: the RLIMIT_CORE the program and an
exec'd child run with, what each attempt to change it did, and for each crash (in this process's children
and in an exec'd program) the signal and whether the kernel reported a core dump; and every file named
like a core anywhere in the box's writable directories.
"""

import ctypes
import errno
import json
import os
import resource
import signal
import subprocess

CORE = resource.RLIMIT_CORE
out = {"limit": list(resource.getrlimit(CORE))}


def attempt(name, call):
    try:
        call()
        out[name] = "changed"
    except OSError as exc:
        out[name] = errno.errorcode.get(exc.errno, str(exc.errno))
    except ValueError as exc:
        out[name] = f"ValueError: {exc}"


attempt("setrlimit 0", lambda: resource.setrlimit(CORE, (0, 0)))
attempt("setrlimit unlimited", lambda: resource.setrlimit(CORE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY)))
attempt("prlimit self 0", lambda: resource.prlimit(0, CORE, (0, 0)))
attempt("prlimit own pid 0", lambda: resource.prlimit(os.getpid(), CORE, (0, 0)))
sleeper = subprocess.Popen(["/usr/bin/sleep", "30"])
attempt("prlimit child 0", lambda: resource.prlimit(sleeper.pid, CORE, (0, 0)))
out["child limit"] = list(resource.prlimit(sleeper.pid, CORE))
sleeper.kill()
sleeper.wait()
out["limit after"] = list(resource.getrlimit(CORE))
out["exec'd limit"] = subprocess.run(
    ["/usr/bin/python3", "-c", "import resource; print(*resource.getrlimit(resource.RLIMIT_CORE))"],
    capture_output=True, text=True).stdout.split()


def crash(how):
    if how == "segv":
        ctypes.string_at(0)
    elif how == "abort":
        os.abort()
    else:
        os.kill(os.getpid(), signal.SIGQUIT)


for cwd in ("/box", "/tmp"):
    for how in ("segv", "abort", "quit"):
        pid = os.fork()
        if pid == 0:
            os.chdir(cwd)
            crash(how)
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        out[f"{how} in {cwd}"] = [os.WTERMSIG(status) if os.WIFSIGNALED(status) else None, os.WCOREDUMP(status)]
execd = subprocess.run(["/usr/bin/python3", "-c", "import os; os.abort()"], cwd="/box")
out["exec'd abort"] = [-execd.returncode, None]
cores = []
for top in ("/box", "/tmp", "/dev/shm"):
    for root, _dirs, files in os.walk(top):
        cores += [os.path.join(root, f) for f in files if f.startswith("core")]
out["core files"] = cores
print(json.dumps(out))
