"""Weight sync: each version a policy line publishes, loaded into every replica of the endpoints that serve it.

A trainer publishes a version's weights to the farm (``PublishPolicy``: one safetensors file, the names
``save_pretrained`` gives them). For every ``[endpoints.NAME]`` with ``serves = LINE`` and ``sync = "reload"``,
``WeightSync`` writes the file to ``weights_dir/LINE-vVERSION/model.safetensors`` and asks each replica that is up,
in parallel, to load it without a restart (vLLM with ``VLLM_SERVER_DEV_MODE=1``). Meanwhile farmd sends that replica
nothing new and lets what it has in flight finish first (``ReplicaSet.drained``, up to ``DRAIN_S``): a request
that began before a load and ended after it is stamped 0, and measured here, with a version every two or three
seconds and 64 requests in flight, a fifth to a third of them were, before it waited. Then:

1. ``POST /update_weight_version`` ``LINE:VERSION:loading``: from here on, nothing it samples is stamped with the
   version it had (``farmd.agents.replicas.stamp``: a request is stamped only when its labels before and after agree);
2. ``POST /collective_rpc`` ``reload_weights`` from the directory (about 0.02 s for a model of a million weights);
3. ``POST /reset_prefix_cache?reset_running_requests=true``: no cached prefix computed with the old weights is
   reused (a request running now is recomputed: its label read after will not match, and it is stamped 0);
4. ``POST /update_weight_version`` ``LINE:VERSION``, read back with ``GET /weight_info``.

Only once every replica that is up has it does the endpoint's jobs lease that version (``Policies.synced``). A
replica that fails a step is counted as failing a health check (two take it out); a replica that comes back is
loaded with the endpoint's current version before it is asked anything (``recover``). Versions published while one
loads are not queued: the newest is loaded next. Why reload from a directory and not one LoRA adapter per version:
the trainer learns every weight of the model (a LoRA trains a small part of it), a reload of a small model takes
milliseconds, and the server keeps one set of weights instead of an adapter per version to unload; on a cluster
the directory is on a filesystem the servers share (``weights_dir``), and for weights of many gigabytes an NCCL
broadcast from the trainer (vLLM's ``/init_weight_transfer_engine`` and ``/update_weights``) avoids the disk:
``sync = "none"`` leaves loading to the trainer, which then sets the label itself, and farmd only reads it back.

A file that is not a well-formed safetensors file (its header longer than the file, or past ``MAX_HEADER_BYTES``, or
its tensors outside the file) is refused before any server reads it: that version is never loaded, never stamped.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import struct
import time
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from farmd.agents.registry import NamedEndpoint
from farmd.agents.replicas import Replica, ReplicaSet, label
from farmd.errors import SyncFailed, WeightsRefused

log = logging.getLogger("farmd.agents.weights")

MAX_HEADER_BYTES = 100 << 20
"""A safetensors header past this is refused (the format's own reader refuses the same)."""
KEEP_VERSIONS = 3
"""Version directories kept per line: the one loaded and a couple before it (a replica may still be loading one)."""
RELOAD_TIMEOUT_S = 600.0
DRAIN_S = 10.0
"""How long a load waits for the requests in flight on a replica to finish (new ones wait meanwhile): a request
across a load is stamped 0, so one that ends within this is kept. Replies of a few tokens take well under a second
here; long generations on a GPU may take longer, and are then cut (stamped 0) rather than hold every version."""
_DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1,
                "F8_E4M3": 1, "F8_E5M2": 1, "U16": 2, "U32": 4, "U64": 8}




def check_safetensors(path: Path) -> int:
    """The number of tensors in the safetensors file at ``path``; ``WeightsRefused`` saying why it is not one.

    Reads the header alone (bounded by ``MAX_HEADER_BYTES`` and the file's size before a byte of it is read), and
    checks every tensor's dtype, shape and byte range against each other and the file: a declared size decides
    nothing that is not there."""
    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise WeightsRefused("shorter than a safetensors header")
        (length,) = struct.unpack("<Q", head)
        if length > MAX_HEADER_BYTES or length > size - 8:
            raise WeightsRefused(f"its header says {length} bytes, and the file holds {size - 8} after it")
        try:
            header = json.loads(f.read(length))
        except (ValueError, RecursionError) as exc:
            raise WeightsRefused(f"its header is not JSON: {exc}") from None
    if not isinstance(header, dict):
        raise WeightsRefused("its header is not a table of tensors")
    data = size - 8 - length
    tensors = 0
    for name, spec in header.items():
        if name == "__metadata__":
            continue
        if not isinstance(spec, dict) or spec.get("dtype") not in _DTYPE_BYTES:
            raise WeightsRefused(f"tensor {name[:80]!r}: no known dtype")
        shape, offsets = spec.get("shape"), spec.get("data_offsets")
        if not (isinstance(shape, list) and all(isinstance(d, int) and d >= 0 for d in shape)
                and isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)):
            raise WeightsRefused(f"tensor {name[:80]!r}: malformed shape or offsets")
        count = 1
        for d in shape:
            count *= d
        start, end = offsets
        if not 0 <= start <= end <= data or end - start != count * _DTYPE_BYTES[spec["dtype"]]:
            raise WeightsRefused(f"tensor {name[:80]!r}: bytes {start}..{end} do not hold its shape {shape} "
                                 f"in {data} bytes of data")
        tensors += 1
    if not tensors:
        raise WeightsRefused("it holds no tensor")
    return tensors


@dataclass(frozen=True)
class Published:
    """What the sync needs of a published policy."""

    name: str
    version: int
    sha256: str
    uri: str | None


Content = Callable[[str], AsyncGenerator[bytes, None]]
"""The content of the policy with this sha256, in chunks (the store's)."""
Synced = Callable[[str, int], None]
"""Told ``(endpoint, version)`` once every replica of the endpoint that is up has loaded the version."""


class _Endpoint:
    def __init__(self, endpoint: NamedEndpoint, replicas: ReplicaSet, weights_dir: Path) -> None:
        self.config = endpoint
        self.line = endpoint.serves or ""
        self.replicas = replicas
        self.weights_dir = weights_dir
        self.wanted: Published | None = None
        self.current: tuple[int, Path] | None = None
        """The version every replica up has, and where its weights are."""
        self.wake = asyncio.Event()
        self.task: asyncio.Task[None] | None = None


class WeightSync:
    """Loads every version of the lines the endpoints serve into their replicas (``sync = "reload"`` ones)."""

    def __init__(self, endpoints: Sequence[NamedEndpoint], replicas: dict[str, ReplicaSet], data_dir: Path,
                 content: Content, synced: Synced) -> None:
        self._content = content
        self._synced = synced
        self._endpoints: dict[str, _Endpoint] = {}
        for e in endpoints:
            if e.serves is None or e.sync != "reload":
                continue
            state = _Endpoint(e, replicas[e.name], Path(e.weights_dir) if e.weights_dir else data_dir / "weights")
            replicas[e.name].recover = self._recoverer(state)
            self._endpoints[e.name] = state
        self.loads = 0
        """Replica loads done (every replica, every version)."""

    @property
    def endpoints(self) -> list[str]:
        return list(self._endpoints)

    @property
    def lines(self) -> set[str]:
        return {s.line for s in self._endpoints.values()}

    async def start(self, newest: dict[str, Published]) -> None:
        """Start each endpoint's sync, with its line's newest version (a restarted farmd loads it again)."""
        loop = asyncio.get_running_loop()
        for name, state in self._endpoints.items():
            state.replicas.start()
            state.wanted = newest.get(state.line)
            if state.wanted is not None:
                state.wake.set()
            state.task = loop.create_task(self._run(state), name=f"weight-sync-{name}")

    async def aclose(self) -> None:
        tasks = [s.task for s in self._endpoints.values() if s.task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def published(self, policy: Published) -> None:
        """A version was published: the endpoints serving its line load it next (the last published, if more come
        first; an earlier version published again, by a trainer resumed from a checkpoint, is loaded again)."""
        for state in self._endpoints.values():
            if state.line == policy.name:
                state.wanted = policy
                state.wake.set()

    async def _run(self, state: _Endpoint) -> None:
        while True:
            await state.wake.wait()
            state.wake.clear()
            wanted = state.wanted
            if wanted is None or (state.current is not None and state.current[0] == wanted.version):
                continue
            try:
                directory = await self._materialize(state, wanted)
            except (WeightsRefused, OSError) as exc:
                log.error("endpoint %s: version %d of %s is not loaded: %s", state.config.name, wanted.version,
                          wanted.name, exc, extra={"event": "weights_refused", "endpoint": state.config.name,
                                                   "version": wanted.version})
                continue
            up = [r for r in state.replicas.replicas if r.up]
            results = await asyncio.gather(*(self._load(state, r, wanted.version, directory) for r in up),
                                           return_exceptions=True)
            for replica, result in zip(up, results, strict=True):
                if isinstance(result, BaseException):
                    state.replicas.failed(replica, f"it did not load version {wanted.version}: {result}")
            if any(isinstance(r, BaseException) for r in results):
                # Tried again: a replica that failed once is not out yet, and must have it before it is stamped.
                state.wake.set()
                await asyncio.sleep(state.replicas.health.every_s)
                continue
            state.current = (wanted.version, directory)
            self._synced(state.config.name, wanted.version)
            log.info("endpoint %s: version %d of %s loaded into %d replica(s)", state.config.name, wanted.version,
                     wanted.name, len(up), extra={"event": "weights_synced", "endpoint": state.config.name,
                                                  "version": wanted.version})
            await asyncio.to_thread(_prune, state.weights_dir, state.line, wanted.version)

    async def _materialize(self, state: _Endpoint, policy: Published) -> Path:
        """The version's directory under ``weights_dir``, its file written (and checked) once."""
        directory = state.weights_dir / f"{state.line}-v{policy.version}"
        target = directory / "model.safetensors"
        if target.exists():
            return directory
        await asyncio.to_thread(directory.mkdir, parents=True, exist_ok=True)
        partial = directory / f".model.safetensors.{os.getpid()}.part"
        fd = await asyncio.to_thread(os.open, partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            async with contextlib.aclosing(self._content(policy.sha256)) as chunks:
                async for chunk in chunks:
                    await asyncio.to_thread(os.write, fd, chunk)
        finally:
            await asyncio.to_thread(os.close, fd)
        try:
            await asyncio.to_thread(check_safetensors, partial)
            await asyncio.to_thread(os.replace, partial, target)
        finally:
            await asyncio.to_thread(partial.unlink, True)
        return directory

    async def _load(self, state: _Endpoint, replica: Replica, version: int, directory: Path) -> None:
        servers = state.replicas
        # Nanoseconds since the epoch: no load of this farmd or an earlier one had the same (a version loaded
        # again after a trainer resumed from an older checkpoint gets a label of its own).
        load = time.time_ns()
        done = label(state.line, version, load)
        steps: list[tuple[str, Any, dict[str, str] | None]] = [
            ("/update_weight_version", {"new_version": label(state.line, version, load, loading=True)}, None),
            ("/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": str(directory)}}, None),
            ("/reset_prefix_cache", None, {"reset_running_requests": "true"}),
            ("/update_weight_version", {"new_version": done}, None),
        ]
        async with servers.drained(replica, DRAIN_S):
            for path, body, params in steps:
                try:
                    response = await servers.post(replica, path, json=body, params=params,
                                                  timeout_s=RELOAD_TIMEOUT_S)
                except Exception as exc:
                    raise SyncFailed(f"{path}: {type(exc).__name__}: {exc}"[:500]) from None
                if response.status_code != 200:
                    raise SyncFailed(f"{path}: HTTP {response.status_code}: {response.text[:300]!r} (is the server "
                                     "started with VLLM_SERVER_DEV_MODE=1?)")
                if path == "/reset_prefix_cache" and response.json().get("success") is not True:
                    raise SyncFailed(f"{path}: the server could not reset its prefix cache: {response.text[:200]!r}")
            read = await servers.label_now(replica)
        if read != done:
            raise SyncFailed(f"it reads back {read!r}, not {done!r}")
        self.loads += 1

    def _recoverer(self, state: _Endpoint) -> Callable[[Replica], Any]:
        async def recover(replica: Replica) -> bool:
            if state.current is not None:
                await self._load(state, replica, *state.current)
            return True
        return recover


def _prune(weights_dir: Path, line: str, loaded: int) -> None:
    """Leave the newest ``KEEP_VERSIONS`` version directories of ``line``: older ones no replica will load again."""
    found = []
    for entry in weights_dir.glob(f"{line}-v*"):
        number = entry.name.removeprefix(f"{line}-v")
        if number.isdigit() and int(number) < loaded:
            found.append((int(number), entry))
    for _, entry in sorted(found)[:-KEEP_VERSIONS + 1] if len(found) >= KEEP_VERSIONS else []:
        shutil.rmtree(entry, ignore_errors=True)
