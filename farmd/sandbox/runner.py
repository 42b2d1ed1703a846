"""The one entry point for running untrusted code: ``Sandbox.run``.

A box's life, host side:

1. launch (``launch.py``): take a slot uid, mount its scratch tmpfs, create its
   cgroup, start bwrap as the slot uid and admit its pid 1 into the cgroup before
   anything runs. The box's init (``stub.py``) then waits for a program. Boxes
   can be launched ahead of demand (warm boxes), which takes the launch off the
   request's path.
2. release: set the bounds, copy the caller's files in, send the program.
3. watch (``watch.py``): a wall-clock timer, a CPU/process/disk monitor and the
   output readers kill the whole box the moment a bound is hit; the init
   reports the program's exact wait status.
4. clean up: harvest files if asked (never following links), unmount the
   scratch, remove the cgroup, give the slot back.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import functools
import itertools
import logging
import marshal
import math
import os
import time
from collections.abc import Coroutine, Mapping, Sequence
from pathlib import Path
from typing import Any

from farmd.errors import IsolationUnavailable, PolicyError, SandboxError
from farmd.sandbox import cgroups, command, reaper, scratch, seccomp
from farmd.sandbox.config import SandboxConfig
from farmd.sandbox.host import bwrap_binary, check_host, missing
from farmd.sandbox.launch import INFRA_PIDS, Launcher, teardown
from farmd.sandbox.policy import DEFAULT_POLICY, SandboxPolicy
from farmd.sandbox.result import BoxResult
from farmd.sandbox.runtime import (
    RuntimeSources,
    compile_box_init,
    default_run_dir,
    default_site_dir,
    prepare_layout,
)
from farmd.sandbox.slots import Slot, SlotPool
from farmd.sandbox.watch import Box, Run

log = logging.getLogger("farmd.sandbox")

_EXIT_GRACE_S = 5.0
_WARM_SHAPES = 4
# Threads that fork bwrap. They live as long as the sandbox: the parent-death signal
# tying a box to farmd fires when the *thread* that forked it exits.
_SPAWNER_THREADS = 2

# Unique per process (box names carry the pid), whatever number of Sandboxes it holds.
_BOX_IDS = itertools.count()

Files = Path | Mapping[str, bytes]
Shape = tuple[int, int, int, int]


class Sandbox:
    """Runs programs in boxes. One per process; safe to share between tasks of one event loop.

    ``await sandbox.run(["python3", "main.py"], policy, files={...})`` returns a
    ``BoxResult`` whatever the program does; it raises ``SandboxError`` only when
    the sandbox itself fails, and ``IsolationUnavailable`` (before running
    anything) when this host cannot isolate a box.
    """

    def __init__(self, config: SandboxConfig | None = None) -> None:
        self.config = config or SandboxConfig()
        self.run_dir = self.config.run_dir or default_run_dir()
        self._launcher: Launcher | None = None
        self._slots: SlotPool | None = None
        self._spawner: concurrent.futures.ThreadPoolExecutor | None = None
        self._warm: dict[Shape, list[Box]] = {}
        self._warm_order: list[Shape] = []
        self._pending: dict[Shape, int] = {}
        """Warm boxes of each shape being launched right now."""
        self._tasks: set[asyncio.Task[None]] = set()
        """Refills and teardowns in flight; close() waits for them."""
        self._launching: set[asyncio.Future[Box]] = set()
        """Launches under way in the spawner threads: ``close`` waits for them, so none outlives it."""
        self._live: set[Box] = set()
        self._all_gone = asyncio.Event()
        self._all_gone.set()
        self._start_lock = asyncio.Lock()
        self._closing = False
        self.outcomes: collections.Counter[str] = collections.Counter()
        """How boxes ended since start (``BoxResult.outcome``, or ``start_failed``): for metrics."""

    # -- life cycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Check the host and prepare the box runtime. Raises IsolationUnavailable if it cannot isolate."""
        async with self._start_lock:
            if self._launcher is not None:
                return
            loop = asyncio.get_running_loop()
            launcher = await loop.run_in_executor(None, self._prepare)
            reaper.become_subreaper()
            self._slots = SlotPool(self.run_dir, self.config.uid_base, self.config.uid_count, self.config.boxes)
            self._spawner = concurrent.futures.ThreadPoolExecutor(_SPAWNER_THREADS, thread_name_prefix="farm-spawn")
            self._launcher = launcher
            if self.config.warm_boxes:
                self._remember_shape(DEFAULT_POLICY.mount_shape())
                self._schedule_refill(DEFAULT_POLICY.mount_shape())

    def _prepare(self) -> Launcher:
        checks = check_host(self.config)
        gaps = missing(checks)
        if gaps:
            raise IsolationUnavailable(gaps)
        bwrap = bwrap_binary(self.config)
        assert bwrap is not None  # check_host proved it exists
        layout = prepare_layout(
            self.run_dir,
            RuntimeSources(bwrap=bwrap, site_dir=self.config.site_dir or default_site_dir(),
                           python=self.config.box_python),
        )
        driver = cgroups.detect()
        swept = driver.sweep() + scratch.sweep(self.run_dir / "boxes")
        if swept:
            log.info("removed %d leftovers of boxes whose farmd died", swept)
        seccomp.compile_bpf()
        return Launcher(
            layout=layout,
            init_code=compile_box_init(self.config.box_python),
            cgroups=driver,
            boxes_dir=self.run_dir / "boxes",
            timeout_s=self.config.launch_timeout_s,
        )

    async def close(self) -> None:
        """Stop every box: warm ones are told to exit, running ones are killed."""
        self._closing = True
        if self._slots is not None:
            await self._slots.stop()  # whoever waits for a slot gives up now
        # A launch whose caller was cancelled ends in its thread; its box's teardown is a task of ours then.
        await asyncio.gather(*list(self._launching), return_exceptions=True)
        # Refills stop at their next step (they check _closing); teardowns run to the end.
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
        warm = [b for boxes in self._warm.values() for b in boxes]
        self._warm.clear()
        for box in warm:
            await self._destroy(box)
        for box in list(self._live):
            box.kill()
        # Killed boxes end their runs, which schedule the boxes' teardowns.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._all_gone.wait(), _EXIT_GRACE_S)
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
        if self._spawner is not None:
            self._spawner.shutdown(wait=True)
        if self._slots is not None:
            self._slots.close()

    async def __aenter__(self) -> Sandbox:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- running ------------------------------------------------------------------------------

    async def run(
        self,
        argv: Sequence[str],
        policy: SandboxPolicy = DEFAULT_POLICY,
        *,
        files: Files | None = None,
        keep: Path | None = None,
    ) -> BoxResult:
        """Run ``argv`` in a fresh box under ``policy``; ``files`` go into its working directory first.

        With ``keep``, the working directory's regular files are copied there afterwards
        (links and special files skipped, listed in ``result.harvest``).
        """
        if not argv or not all(isinstance(a, str) and a and "\0" not in a for a in argv[:1]):
            raise PolicyError("a command needs a non-empty program name")
        if any("\0" in a for a in argv):
            raise PolicyError("command arguments must not hold NUL bytes")
        if self._closing:
            raise SandboxError("the sandbox is shutting down")
        await self.start()
        requested_at = time.monotonic()
        shape = policy.mount_shape()
        box = self._take_warm(shape)
        warm = box is not None
        if box is None:
            try:
                box = await self._launch(policy)
            except BaseException:
                self.outcomes["start_failed"] += 1
                raise
        self._remember_shape(shape)
        if self.config.warm_boxes:
            self._schedule_refill(shape)
        try:
            res = await self._execute(box, argv, policy, files, requested_at)
            res.warm = warm
            res.harvest = await self._finish(box, keep, policy)
            self.outcomes[res.outcome] += 1
            return res
        except BaseException:
            # Shielded: a second cancellation (a caller tearing down a group of runs) must not leave the
            # box's teardown half done and its processes running with nobody holding them.
            await asyncio.shield(self._destroy(box))
            raise

    # -- launching ----------------------------------------------------------------------------

    async def _launch(self, policy: SandboxPolicy) -> Box:
        assert self._slots is not None and self._spawner is not None and self._launcher is not None
        if self._warm:
            await self._evict_warm_if_full()
        slot = await self._slots.acquire()
        box_id = f"{os.getpid()}-{next(_BOX_IDS)}"
        loop = asyncio.get_running_loop()
        launched = loop.run_in_executor(self._spawner, self._launcher.launch, box_id, slot, policy)
        self._launching.add(launched)
        launched.add_done_callback(self._launching.discard)
        try:
            box = await asyncio.shield(launched)
        except asyncio.CancelledError:
            # The launch goes on in its thread whatever happens here: the box it makes is torn down (and
            # its slot freed) when it is made, never left running with nobody holding it.
            launched.add_done_callback(functools.partial(self._orphaned, slot))
            raise
        except BaseException:
            await self._slots.release(slot)
            raise
        self._live.add(box)
        self._all_gone.clear()
        return box

    # -- warm boxes ---------------------------------------------------------------------------

    def _take_warm(self, shape: Shape) -> Box | None:
        boxes = self._warm.get(shape)
        while boxes:
            box = boxes.pop(0)
            if box.proc.poll() is None:
                return box
            self._background(self._destroy(box))
        return None

    def _remember_shape(self, shape: Shape) -> None:
        if shape in self._warm_order:
            self._warm_order.remove(shape)
        self._warm_order.insert(0, shape)
        for old in self._warm_order[_WARM_SHAPES:]:
            for box in self._warm.pop(old, []):
                self._background(self._destroy(box))
        del self._warm_order[_WARM_SHAPES:]

    def _schedule_refill(self, shape: Shape) -> None:
        """Start boxes of ``shape`` until the pool holds ``warm_boxes``, as many at once as there are spawners."""
        if self._closing:
            return
        missing = self.config.warm_boxes - len(self._warm.get(shape, [])) - self._pending.get(shape, 0)
        for _ in range(min(missing, _SPAWNER_THREADS - self._pending.get(shape, 0))):
            self._pending[shape] = self._pending.get(shape, 0) + 1
            self._background(self._refill(shape))

    async def _refill(self, shape: Shape) -> None:
        assert self._slots is not None
        disk_mb, disk_inodes, tmp_mb, shm_mb = shape
        policy = DEFAULT_POLICY.with_overrides(disk_mb=disk_mb, disk_inodes=disk_inodes, tmp_mb=tmp_mb,
                                               shm_mb=shm_mb)
        try:
            # Never let warm boxes take the last slot from a run that waits for one.
            if self._closing or len(self._live) >= self._slots.capacity - 1:
                return
            try:
                box = await self._launch(policy)
            except (SandboxError, OSError) as exc:
                log.warning("could not start a warm box: %s", exc)
                return
            if self._closing or shape not in self._warm_order:
                await self._destroy(box)
                return
            self._warm.setdefault(shape, []).append(box)
        finally:
            self._pending[shape] -= 1
        self._schedule_refill(shape)

    async def _evict_warm_if_full(self) -> None:
        assert self._slots is not None
        if len(self._live) < self._slots.capacity:
            return
        for shape in reversed(self._warm_order):
            if self._warm.get(shape):
                await self._destroy(self._warm[shape].pop(0))
                return

    # -- executing ----------------------------------------------------------------------------

    async def _execute(
        self, box: Box, argv: Sequence[str], policy: SandboxPolicy, files: Files | None, requested_at: float
    ) -> BoxResult:
        loop = asyncio.get_running_loop()
        box.set_limits(policy.memory_bytes, policy.pids + INFRA_PIDS, policy.cpus)
        if files is not None:
            await loop.run_in_executor(None, scratch.copy_in, files, box.scratch, box.slot.uid, box.slot.gid)
        request = marshal.dumps(
            {
                "argv": list(argv),
                "env": command.box_env(policy),
                "cwd": command.BOX_WORKDIR,
                "rlimits": _rlimits(policy),
                "watch": ["/tmp", "/dev/shm"],
            },
            4,
        )
        run = Run(box, policy, loop)
        try:
            run.start(request)
        except OSError as exc:
            run.stop()
            raise SandboxError(f"box {box.box_id}: its init is gone before the program was sent: {exc}") from exc
        try:
            await run.done
        finally:
            run.stop()
        if run.exit is None and run.started_at is None:
            # The program never started (the init tells the host before it becomes the program): bwrap or the init
            # ended first, as on a host that cannot build boxes now. The host's failure, never the program's doing.
            raise SandboxError(f"box {box.box_id}: it ended before its program started (bwrap exit status "
                               f"{run.bwrap_status})")
        try:
            return run.result(requested_at)
        except OSError as exc:
            raise SandboxError(f"box {box.box_id}: cgroup unreadable: {exc}") from exc

    # -- cleaning up --------------------------------------------------------------------------

    async def _finish(self, box: Box, keep: Path | None, policy: SandboxPolicy) -> scratch.Harvest | None:
        loop = asyncio.get_running_loop()
        harvest = None
        if keep is not None:
            harvest = await loop.run_in_executor(None, scratch.harvest, box.scratch, keep, policy.disk_bytes, True)
        # The result is complete and the box's processes are gone; removing its mount and
        # cgroup need not hold up the caller. close() waits for every teardown.
        self._background(self._destroy(box))
        return harvest

    def _orphaned(self, slot: Slot, launched: asyncio.Future[Box]) -> None:
        """A launch whose caller was cancelled has ended: destroy its box, or free its slot if it made none."""
        if not launched.cancelled() and launched.exception() is None:
            box = launched.result()
            self._live.add(box)
            self._all_gone.clear()
            self._background(self._destroy(box))
        else:
            assert self._slots is not None
            self._background(self._slots.release(slot))

    def _background(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _destroy(self, box: Box) -> None:
        """Kill whatever is left of a box and remove every trace of it from the host."""
        if box.closed:
            return
        box.closed = True
        assert self._slots is not None
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(None, teardown, box)
        finally:
            self._live.discard(box)
            if not self._live:
                self._all_gone.set()
            await self._slots.release(box.slot)


def _rlimits(policy: SandboxPolicy) -> dict[str, tuple[int, int]]:
    cpu = math.ceil(policy.cpu_time_s)
    # Backstops only, set just above what the box's mounts and cgroup allow, so that the
    # kernel's own bound is hit first and recorded: ENOSPC on a full tmpfs (not EFBIG), and
    # the pids cgroup's "max" event (not a silent EAGAIN from RLIMIT_NPROC).
    file_bytes = (max(policy.disk_mb, policy.tmp_mb, policy.shm_mb) + 1) * 1024 * 1024
    nproc = policy.pids + INFRA_PIDS + 8  # the user namespace counts tasks a little differently
    return {
        "RLIMIT_NOFILE": (policy.open_files, policy.open_files),
        "RLIMIT_NPROC": (nproc, nproc),
        "RLIMIT_FSIZE": (file_bytes, file_bytes),
        # RLIMIT_CORE is the init's (stub.py), fixed at 1 for the whole box: 0 would not stop a
        # core_pattern pipe helper, and the filter refuses the program's own attempts to set it.
        # A per-process backstop; the cgroup monitor bounds the box as a whole.
        "RLIMIT_CPU": (cpu + 1, cpu + 2),
    }


__all__ = ["BoxResult", "Sandbox"]
