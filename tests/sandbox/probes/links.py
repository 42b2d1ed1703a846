"""Probe: plant links to host files in the scratch directory, for ``--out`` to (not) follow.

argv[1] is the host path of a root-only secret file. Prints JSON: the outcome of each
hard-link attempt and the SHA-256 of the regular files this program wrote.
"""

import errno
import hashlib
import json
import os
import sys
from pathlib import Path

secret = sys.argv[1]
links = {
    "shadow_link": "/etc/shadow",
    "passwd_link": "/etc/passwd",
    "secret_link": secret,
    "proc_root_secret_link": "/proc/1/root" + secret,
    "root_dir_link": "/",
    "etc_dir_link": "/etc",
    "usr_bin_link": "/usr/bin",
    "python_link": "/usr/bin/python3",
}
for name, target in links.items():
    os.symlink(target, name)
os.mkdir("sub")
os.symlink("/etc", "sub/etc_link")
os.symlink("../passwd_link", "sub/chain_link")
hard = {}
for name, target in (("hard_passwd", "/etc/passwd"), ("hard_python", "/usr/bin/python3"),
                     ("hard_numpy", "/opt/farm/site/numpy/__init__.py")):
    try:
        os.link(target, name)
        hard[name] = "linked"
    except OSError as exc:
        hard[name] = errno.errorcode.get(exc.errno)
payload = os.urandom(50_000) + "é✓\n".encode()
with open("real.bin", "wb") as fh:
    fh.write(payload)
with open("sub/nested.txt", "w") as fh:
    fh.write("nested\n")
with open("a.txt", "w") as fh:
    fh.write("linked twice\n")
os.link("a.txt", "b.txt")
os.mkfifo("fifo")
os.chmod("real.bin", 0o4755)  # a setuid bit on the box's own file: must not come out
digests = {name: hashlib.sha256(Path(name).read_bytes()).hexdigest() for name in ("real.bin", "sub/nested.txt")}
print(json.dumps({"hard": hard, "digests": digests}))
