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
        _check_argv(argv)
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

    async def _launch(self, policy: SandboxPolicy, stdin: bool = False) -> Box:
        assert self._slots is not None and self._spawner is not None and self._launcher is not None
        if self._warm:
            await self._evict_warm_if_full()
        slot = await self._slots.acquire()
        box_id = f"{os.getpid()}-{next(_BOX_IDS)}"
        loop = asyncio.get_running_loop()
        launched = loop.run_in_executor(self._spawner, self._launcher.launch, box_id, slot, policy, stdin)
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
        run = await self._begin(box, argv, policy, files)
        try:
            await run.done
        finally:
            run.stop()
        return self._ended(box, run, requested_at)

    async def _begin(self, box: Box, argv: Sequence[str], policy: SandboxPolicy, files: Files | None) -> Run:
        """The program started in ``box`` and watched (await ``run.done``)."""
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
        return run

    def _ended(self, box: Box, run: Run, requested_at: float) -> BoxResult:
        """The result of a run that is done (read from the box's cgroup: before its teardown)."""
        if run.exit is None and run.started_at is None:
            # The program never started (the init tells the host before it becomes the program): bwrap or the init
            # ended first, as on a host that cannot build boxes now. The host's failure, never the program's doing.
            raise SandboxError(f"box {box.box_id}: it ended before its program started (bwrap exit status "
                               f"{run.bwrap_status})")
        try:
            return run.result(requested_at)
        except OSError as exc:
            raise SandboxError(f"box {box.box_id}: cgroup unreadable: {exc}") from exc

    # -- sessions -----------------------------------------------------------------------------

    async def session(self, argv: Sequence[str], policy: SandboxPolicy = DEFAULT_POLICY, *,
                      files: Files | None = None) -> BoxSession:
        """``argv`` in a fresh box of its own that takes input while it runs (its stdin is a pipe: ``send``), and
        whose output is read as it comes (``take``, ``output``). The policy's bounds hold for the whole session,
        raised for each piece of work by ``allow``; the output bound holds for what is written and not yet taken.
        ``await session.close()`` ends its stdin and returns its ``BoxResult`` once it has ended."""
        _check_argv(argv)
        if self._closing:
            raise SandboxError("the sandbox is shutting down")
        await self.start()
        requested_at = time.monotonic()
        try:
            box = await self._launch(policy, stdin=True)
        except BaseException:
            self.outcomes["start_failed"] += 1
            raise
        try:
            run = await self._begin(box, argv, policy, files)
        except BaseException:
            await asyncio.shield(self._destroy(box))
            raise
        session = BoxSession(self, box, run, requested_at)
        # Returned once its program runs: a session ended before that is the host's failure (``_ended``), raised
        # here, never something its owner does later (a ``kill``) turned into one.
        try:
            await asyncio.wait([run.started, run.done], return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            session.kill()
            raise
        if not run.started.done():
            await session.close()
        return session

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


class BoxSession:
    """A program running in a box of its own that takes input while it runs (``Sandbox.session``).

    Whatever ends it (its own exit, a bound, ``kill``, the sandbox closing), its result is read and its box torn
    down at once, whether or not anyone calls ``close``."""

    def __init__(self, sandbox: Sandbox, box: Box, run: Run, requested_at: float) -> None:
        self._sandbox = sandbox
        self._box = box
        self._run = run
        self._requested_at = requested_at
        self._news = asyncio.Event()
        run.on_output = self._news.set
        self._outcome: asyncio.Future[BoxResult] = asyncio.get_running_loop().create_future()
        self._outcome.add_done_callback(_retrieved)  # a session nobody closes has nobody to tell
        run.done.add_done_callback(lambda _: sandbox._background(self._wind_up()))

    @property
    def ended(self) -> bool:
        """Whether the program has ended (or been ended): it takes nothing more."""
        return self._run.done.done() or self._run.killed or self._run.exit is not None

    @property
    def started_at(self) -> float:
        """When its program started (``time.monotonic()``)."""
        return self._run.started_at or self._requested_at

    def cpu_s(self) -> float:
        """CPU seconds the box has used since its program started, as its cgroup counts them."""
        try:
            return max(0.0, (self._box.cgroup.cpu_ns() - self._run.cpu_base) / 1e9)
        except OSError:
            return 0.0

    def allow(self, cpu_s: float, wall_s: float) -> None:
        """Bounds for the next piece of work: ``cpu_s`` more CPU seconds, and ``wall_s`` from now at least."""
        self._run.allow(cpu_s, wall_s)

    async def send(self, data: bytes) -> bool:
        """``data`` written to the program's stdin; False if it no longer reads it (ended, or closed it)."""
        loop = asyncio.get_running_loop()
        view = memoryview(data)
        while view:
            if self._box.in_fd < 0 or self.ended:
                return False
            try:
                view = view[os.write(self._box.in_fd, view):]
            except BlockingIOError:
                room: asyncio.Future[None] = loop.create_future()
                loop.add_writer(self._box.in_fd, _settle, room)
                try:
                    await asyncio.wait([room, self._run.done], return_when=asyncio.FIRST_COMPLETED)
                finally:
                    loop.remove_writer(self._box.in_fd)
            except OSError:  # EPIPE: nobody reads it any more
                return False
        return True

    def take(self) -> bytes:
        """Everything the program wrote to stdout since the last ``take``."""
        out = bytes(self._run.stdout)
        self._run.stdout.clear()
        self._news.clear()
        return out

    async def output(self, timeout_s: float) -> None:
        """Until the program writes more to stdout, ends, or ``timeout_s`` passes."""
        if self._run.stdout or self._run.done.done():
            return
        news: asyncio.Future[Any] = asyncio.ensure_future(self._news.wait())
        try:
            await asyncio.wait([news, self._run.done], timeout=max(0.0, timeout_s),
                               return_when=asyncio.FIRST_COMPLETED)
        finally:
            news.cancel()

    def kill(self) -> None:
        """End it now, whatever it is doing (it is then torn down: ``close`` gives its result)."""
        self._run.kill(None)

    async def close(self) -> BoxResult:
        """End its stdin and wait for it to end (within its wall bound); its result. Raises ``SandboxError`` as
        ``Sandbox.run`` does."""
        self._close_stdin()
        return await asyncio.shield(self._outcome)

    def _close_stdin(self) -> None:
        if self._box.in_fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._box.in_fd)
            self._box.in_fd = -1

    async def _wind_up(self) -> None:
        self._run.stop()
        self._close_stdin()
        try:
            result = self._sandbox._ended(self._box, self._run, self._requested_at)
            self._sandbox.outcomes[result.outcome] += 1
            self._outcome.set_result(result)
        except BaseException as exc:
            self._outcome.set_exception(exc)
        finally:
            await self._sandbox._destroy(self._box)


def _retrieved(future: asyncio.Future[BoxResult]) -> None:
    if not future.cancelled():
        future.exception()


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _check_argv(argv: Sequence[str]) -> None:
    if not argv or not all(isinstance(a, str) and a and "\0" not in a for a in argv[:1]):
        raise PolicyError("a command needs a non-empty program name")
    if any("\0" in a for a in argv):
        raise PolicyError("command arguments must not hold NUL bytes")


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


__all__ = ["BoxResult", "BoxSession", "Sandbox"]
