"""``python -m atroposlib.cli.run_api --host H --port P``, pointed at farmd: ``farmd serve --atropos H:P``,
with its data in $FARM_ATROPOS_DATA (a new directory under it per launch). The process becomes farmd (exec),
so whoever started it stops farmd when it stops the server."""

from __future__ import annotations

import argparse
import os
import tempfile

parser = argparse.ArgumentParser()
parser.add_argument("--host", default="127.0.0.1")
parser.add_argument("--port", type=int, default=8000)
args, _ = parser.parse_known_args()
data = tempfile.mkdtemp(prefix="farmd-", dir=os.environ.get("FARM_ATROPOS_DATA"))
farmd = os.environ["FARM_ATROPOS_FARMD"]
os.execv(farmd, [farmd, "serve", "--atropos", f"{args.host}:{args.port}", "--listen", "127.0.0.1:0",
                 "--workers", "0", "--data", data])
