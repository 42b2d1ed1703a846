"""Probe: what of the host's kernel and filesystem the box can see or change.

Prints JSON: a map of check name -> outcome (a value, or the errno name of the failure).
"""

import errno
import json
import os
import stat
import subprocess
from pathlib import Path

out = {}


def err(exc):
    return errno.errorcode.get(exc.errno, str(exc))


def try_listdir(path):
    try:
        return sorted(os.listdir(path))
    except OSError as exc:
        return err(exc)


def try_write(path, data=b"1\n"):
    try:
        with open(path, "wb") as fh:
            fh.write(data)
        return "written"
    except OSError as exc:
        return err(exc)


def try_read(path):
    try:
        with open(path, "rb") as fh:
            fh.read(64)
        return "read"
    except OSError as exc:
        return err(exc)


for path in ("/sys", "/sys/fs/cgroup", "/run", "/run/farm", "/run/farm/slots", "/root", "/home", "/var",
             "/work", "/srv", "/mnt", "/media", "/usr/local", "/proc/1/root/run", "/proc/2/root/run"):
    out[f"listdir {path}"] = try_listdir(path)
for path in ("/proc/sys/kernel/hostname", "/proc/sys/kernel/core_pattern", "/proc/sys/vm/drop_caches",
             "/proc/sys/kernel/modprobe", "/proc/sysrq-trigger", "/proc/1/attr/current",
             "/proc/self/uid_map", "/proc/self/setgroups", "/proc/sys/user/max_user_namespaces"):
    out[f"write {path}"] = try_write(path)
for path in ("/proc/kcore", "/proc/kmsg", "/dev/core", "/dev/mem", "/dev/kmsg"):
    out[f"read {path}"] = try_read(path)
devices = {}
for root, dirs, files in os.walk("/dev"):
    for name in dirs + files:
        path = os.path.join(root, name)
        st = os.lstat(path)
        if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
            devices[path] = ["block" if stat.S_ISBLK(st.st_mode) else "char", os.major(st.st_rdev),
                             os.minor(st.st_rdev)]
out["devices"] = devices
try:
    os.mknod("/box/evil-null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    out["mknod"] = "created"
except OSError as exc:
    out["mknod"] = err(exc)
out["root listing"] = try_listdir("/")
out["/proc/self/root listing"] = try_listdir("/proc/self/root")
out["/proc/1/root listing"] = try_listdir("/proc/1/root")
try:
    out["/proc/1/cwd"] = os.readlink("/proc/1/cwd")
except OSError as exc:
    out["/proc/1/cwd"] = err(exc)
out["cgroup"] = Path("/proc/self/cgroup").read_text()
out["processes"] = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
status = {}
for pid in out["processes"]:
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        continue
    status[pid] = {k: v.split() for k, v in (line.split(":", 1) for line in lines)
                   if k in ("Uid", "Gid", "CapEff", "CapPrm", "CapBnd", "NoNewPrivs", "Seccomp", "Groups")}
out["status"] = status
nosuid = {}
for path in ("/", "/box", "/tmp", "/dev/shm", "/usr", "/usr/bin", "/opt/farm/site", "/etc"):
    try:
        st = os.statvfs(path)
        nosuid[path] = [bool(st.f_flag & os.ST_NOSUID), bool(st.f_flag & os.ST_RDONLY)]
    except OSError as exc:
        nosuid[path] = err(exc)
out["mount flags"] = nosuid
setuid = []
for d in ("/usr/bin", "/usr/sbin", "/usr/lib", "/usr/libexec"):
    for root, _dirs, files in os.walk(d):
        for name in files:
            path = os.path.join(root, name)
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode) and st.st_mode & stat.S_ISUID:  # host root shows as nobody here
                setuid.append(path)
out["setuid binaries"] = setuid
if os.path.exists("/usr/bin/mount"):
    os.makedirs("/box/mnt", exist_ok=True)
    run = subprocess.run(["/usr/bin/mount", "-t", "tmpfs", "none", "/box/mnt"], capture_output=True, text=True)
    out["setuid mount"] = [run.returncode, run.stderr.strip()[-200:]]
print(json.dumps(out))
