"""The servers behind one endpoint: data-parallel replicas, each checked for health, each asked which weights it has.

``[endpoints.NAME] url`` may list several servers of one model (``url = ["http://a:8000/v1", "http://b:8000/v1"]``).
A request goes to the replica with the fewest requests outstanding (``ReplicaSet.use``). A replica is checked every
``health_every_s`` (``GET {root}{health_path}``, vLLM's and SGLang's ``/health``) within ``health_timeout_s``: any
answer but 500, 502, 503 or 504 is alive, and ``health_failures`` checks in a row without one take it out. Its requests in flight
are cut at once (they raise ``ReplicaDown`` where they wait, and the client asks another replica: the job goes on,
never scored for it), no request goes to it, and it is checked on at the same rate; when it answers again it is
brought back, after ``recover`` (the weight sync: a replica comes back only once it has the weights the others have).
So a server that hangs without closing its connections is found in a few seconds, long before a request's
``request_timeout_s``.

Which weights a replica sampled with is read from it, never assumed (``label_after``): vLLM's ``GET /weight_info``
says the label its engine stamps on every step (``/update_weight_version`` sets it; farmd's weight sync sets
``LINE:VERSION:LOAD`` once a version's weights are loaded, and ``LINE:VERSION:LOAD:loading`` before it starts loading
them; a trainer that loads them itself sets ``LINE:VERSION``). A request is of one version when the label read before
it was sent and the label read after its reply came are the same: each load sets a label no load before it set, so
nothing changed in between. The read after is shared by
every request whose reply came before it started, so a replica at a hundred requests a second is asked a few dozen
times, not a hundred.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from farmd import lazy
from farmd.errors import NoReplica, ReplicaDown

if TYPE_CHECKING:
    import httpx
else:  # only a farm with model endpoints uses it (0.07 s of every start)
    httpx = lazy.module("httpx")

log = logging.getLogger("farmd.agents.replicas")

_SEQ = itertools.count(1)
"""One order for every reply and every label read of this process: a read serves the replies marked before it."""
MAX_LABEL_BYTES = 4096
LABEL_TIMEOUT_S = 10.0
DEAD = frozenset({500, 502, 503, 504})
"""What a server says when it cannot serve (vLLM's ``/health`` answers 503 once its engine died); any other answer,
a 404 or 501 of a server without the route included, is a server that answers."""




def server_root(url: str) -> str:
    """``scheme://host[:port]`` of an API base URL: where a server's own routes (``/health``, ``/weight_info``) are."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


@dataclass(frozen=True, kw_only=True)
class HealthConfig:
    path: str = "/health"
    every_s: float = 1.0
    timeout_s: float = 2.0
    failures: int = 2
    """Checks in a row without an answer that take a replica out."""

    def __post_init__(self) -> None:
        if not self.path.startswith("/") or not self.path.isprintable() or len(self.path) > 200:
            raise ValueError(f"health_path must be a path starting with '/', got {self.path!r}")
        for name in ("every_s", "timeout_s"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or isinstance(value, bool) or not 0 < value <= 600:
                raise ValueError(f"health_{name} must be a number of seconds in (0, 600], got {value!r}")
        if not isinstance(self.failures, int) or isinstance(self.failures, bool) or not 1 <= self.failures <= 100:
            raise ValueError(f"health_failures must be an integer from 1 to 100, got {self.failures!r}")


class _Read:
    __slots__ = ("seq", "task")

    def __init__(self, seq: int, task: asyncio.Task[str | None]) -> None:
        self.seq = seq
        self.task = task


class Replica:
    """One server: where it is, whether it is up, what it is doing and which weights it said it has."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")
        self.root = server_root(self.url)
        self.up = True
        """Until a check says otherwise: a replica no check has failed yet is asked."""
        self.outstanding = 0
        self.failures = 0
        self.label: str | None = None
        """The weight label last read from it (None: none read, or it cannot say)."""
        self.picked = 0
        self.why = ""
        """Why it was last taken out."""
        self._tasks: set[asyncio.Task[object]] = set()
        self._cut = 0
        """Bumped each time it is taken out: a request sent before can tell it was cut."""
        self._current: _Read | None = None
        self._next: asyncio.Task[str | None] | None = None
        self.open = asyncio.Event()
        """Cleared while weights are loaded into it: new requests wait, those in flight finish first."""
        self.open.set()
        self.idle = asyncio.Event()
        """Set whenever nothing is outstanding on it."""
        self.idle.set()

    def __repr__(self) -> str:
        return f"<Replica {self.url} {'up' if self.up else 'down'} {self.outstanding} outstanding>"


class ReplicaSet:
    """The replicas of one endpoint and their health checks (started by the first request, ended by ``aclose``).

    ``recover(replica)``: what must hold before a replica that was out is asked again (the weight sync brings it to
    the version the others serve); True when it does. ``on_change()`` is told whenever a replica goes out or comes
    back (a worker leases this endpoint's jobs only while one is up).
    """

    def __init__(self, name: str, urls: Sequence[str], health: HealthConfig | None = None, *,
                 recover: Callable[[Replica], Awaitable[bool]] | None = None) -> None:
        if not urls:
            raise ValueError(f"endpoint {name}: no url")
        self.name = name
        self.replicas = [Replica(u) for u in urls]
        self.health = health or HealthConfig()
        self.recover = recover
        self.on_change: Callable[[], None] | None = None
        self._http: httpx.AsyncClient | None = None
        self._loop_task: asyncio.Task[None] | None = None
        self._closed = False
        self._rotation = itertools.count()

    # -- choosing -------------------------------------------------------------------------------------

    @property
    def any_up(self) -> bool:
        return any(r.up for r in self.replicas)

    def pick(self, avoid: Replica | None = None) -> Replica:
        """The replica up with the fewest requests outstanding (the least recently picked of equals); one other
        than ``avoid`` when there is one. ``NoReplica`` when none is up."""
        up = [r for r in self.replicas if r.up]
        if not up:
            why = "; ".join(f"{r.url}: {r.why}" for r in self.replicas)
            raise NoReplica(f"none of the endpoint's {len(self.replicas)} servers is up ({why})")
        others = [r for r in up if r is not avoid] or up
        chosen = min(others, key=lambda r: (r.outstanding, r.picked))
        chosen.picked = next(self._rotation)
        return chosen

    @contextlib.asynccontextmanager
    async def use(self, avoid: Replica | None = None) -> AsyncIterator[Replica]:
        """A replica for one request, counted outstanding while it runs. Should the replica be taken out meanwhile,
        the request is cut and ``ReplicaDown`` raised here (another request may be cancelling the task too: then
        the cancellation goes on)."""
        self.start()
        replica = self.pick(avoid)
        task = asyncio.current_task()
        assert task is not None
        cut = replica._cut
        replica.outstanding += 1
        replica.idle.clear()
        replica._tasks.add(task)
        try:
            if not replica.open.is_set():
                # Weights are being loaded into it: wait (counted, so a replica taken out meanwhile cuts it too).
                replica.outstanding -= 1
                if replica.outstanding == 0:
                    replica.idle.set()
                await replica.open.wait()
                replica.outstanding += 1
                replica.idle.clear()
            yield replica
        except asyncio.CancelledError:
            if replica._cut != cut and task.uncancel() == 0:
                raise ReplicaDown(f"{replica.url} was taken out (no answer to {self.health.failures} health "
                                  "checks) while the request waited") from None
            raise
        finally:
            replica.outstanding -= 1
            if replica.outstanding == 0:
                replica.idle.set()
            replica._tasks.discard(task)

    @contextlib.asynccontextmanager
    async def drained(self, replica: Replica, bound_s: float) -> AsyncIterator[None]:
        """While weights are loaded into ``replica``: no new request is sent to it, and those in flight are let
        finish first (up to ``bound_s``; one still running then straddles the load, and is stamped 0). A request
        that began before the load and ends after it would be stamped 0 anyway: waiting for it keeps it."""
        replica.open.clear()
        try:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(bound_s):
                    await replica.idle.wait()
            yield
        finally:
            replica.open.set()

    def failed(self, replica: Replica, why: str) -> None:
        """A request could not reach ``replica``: it counts as a failed check."""
        self._failed(replica, why)

    # -- health ---------------------------------------------------------------------------------------

    def start(self) -> None:
        if self._loop_task is None and not self._closed:
            self._loop_task = asyncio.get_running_loop().create_task(self._checks(), name=f"health-{self.name}")

    def _client(self) -> httpx.AsyncClient:
        if self._http is None:
            # No connection kept between checks: a check opens its own, so a server whose accept queue hangs is
            # found out, and a check never holds a connection a server counts.
            self._http = httpx.AsyncClient(timeout=httpx.Timeout(self.health.timeout_s), trust_env=False,
                                           follow_redirects=False, limits=httpx.Limits(max_keepalive_connections=0))
        return self._http

    async def _checks(self) -> None:
        while not self._closed:
            await asyncio.gather(*(self._check(r) for r in self.replicas))
            await asyncio.sleep(self.health.every_s)

    async def _check(self, replica: Replica) -> None:
        try:
            async with asyncio.timeout(self.health.timeout_s):
                response = await self._client().get(replica.root + self.health.path)
            alive = response.status_code not in DEAD
            why = f"HTTP {response.status_code}"
        except (httpx.HTTPError, TimeoutError, OSError) as exc:
            alive, why = False, f"{type(exc).__name__}: {exc}"[:300] if str(exc) else type(exc).__name__
            if isinstance(exc, httpx.ConnectError):
                why = f"cannot connect to it: {why}"
        if not alive:
            if replica.up and not replica.open.is_set():
                # Busy loading the weights farmd sent it (vLLM's engine answers nothing meanwhile): not dead. Taken
                # out, it would be loaded once more on its return, and a request across that second load stamped 0.
                # A server that died meanwhile fails the load itself, and its checks count again after.
                return
            self._failed(replica, f"its health check failed ({why})")
            return
        replica.failures = 0
        if replica.up:
            return
        try:
            ready = self.recover is None or await self.recover(replica)
        except Exception as exc:  # its weights could not be brought up to date: it stays out, tried again
            log.warning("endpoint %s: %s answers again, but could not be brought back: %s", self.name, replica.url,
                        exc, extra={"event": "replica_recover_failed", "endpoint": self.name, "url": replica.url})
            return
        if ready:
            replica.up = True
            log.warning("endpoint %s: %s is back", self.name, replica.url,
                        extra={"event": "replica_up", "endpoint": self.name, "url": replica.url})
            self._changed()

    def _failed(self, replica: Replica, why: str) -> None:
        replica.failures += 1
        if not replica.up or replica.failures < self.health.failures:
            return
        replica.up = False
        replica.why = why
        replica.label = None
        replica._cut += 1
        me = asyncio.current_task()
        # A request whose own failure this is goes on to its retry: cut, it would end there, as cancelled.
        cut = [task for task in replica._tasks if task is not me]
        for task in cut:
            task.cancel()
        log.warning("endpoint %s: %s taken out: %s; %d request(s) in flight go to another replica", self.name,
                    replica.url, why, len(cut),
                    extra={"event": "replica_down", "endpoint": self.name, "url": replica.url})
        self._changed()

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()

    # -- weight labels --------------------------------------------------------------------------------

    @staticmethod
    def mark() -> int:
        """A point in this process's order of replies and reads: take it when a reply has come."""
        return next(_SEQ)

    async def label_now(self, replica: Replica) -> str | None:
        """A label read that starts now (shared with others that may take one started after they asked)."""
        return await self.label_after(replica, self.mark())

    async def label_after(self, replica: Replica, mark: int) -> str | None:
        """The replica's weight label, read by a request that started after ``mark``; None when it cannot say."""
        current = replica._current
        if current is not None and current.seq > mark:
            return await asyncio.shield(current.task)
        if replica._next is None:
            replica._next = asyncio.get_running_loop().create_task(self._read_after(replica, current))
        return await asyncio.shield(replica._next)

    async def _read_after(self, replica: Replica, before: _Read | None) -> str | None:
        if before is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(before.task)
        task = asyncio.current_task()
        assert task is not None
        # From here on it is the current read: a reply marked before this point is served by it.
        replica._current = _Read(next(_SEQ), task)
        replica._next = None
        label = await self._read_label(replica)
        replica.label = label
        return label

    async def _read_label(self, replica: Replica) -> str | None:
        # A busy server answers a label read late, and a read that fails stamps the replies it serves 0: it is
        # given longer than a health check, and a second try.
        for _ in range(2):
            try:
                async with asyncio.timeout(max(LABEL_TIMEOUT_S, self.health.timeout_s)):
                    response = await self._client().get(replica.root + "/weight_info")
                break
            except (httpx.HTTPError, TimeoutError, OSError):
                continue
        else:
            return None
        if response.status_code != 200 or len(response.content) > MAX_LABEL_BYTES:
            return None
        try:
            label = response.json().get("weight_version")
        except (ValueError, AttributeError):
            return None
        return label if isinstance(label, str) and label.isprintable() else None

    async def post(self, replica: Replica, path: str, *, json: object = None, params: dict[str, str] | None = None,
                   timeout_s: float = 60.0) -> httpx.Response:
        """A control request to one replica's server (the weight sync's)."""
        async with asyncio.timeout(timeout_s):
            return await self._client().post(replica.root + path, json=json, params=params,
                                              timeout=httpx.Timeout(timeout_s))

    async def aclose(self) -> None:
        self._closed = True
        tasks = [t for t in (self._loop_task, *(r._next for r in self.replicas)) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._http is not None:
            http, self._http = self._http, None
            await http.aclose()


def stamp(line: str, before: str | None, after: str | None) -> int:
    """The version of ``line`` a request was sampled with, from the labels read before and after it: 0 unless both
    are the same label ``LINE:VERSION[:LOAD]`` of this line (a server that cannot say, another line, a load
    between). ``LOAD`` (digits) tells two loads of one version apart: a trainer resumed from a checkpoint publishes
    an earlier version again, and a request across both loads must not read the same label on each side."""
    if before is None or before != after:
        return 0
    parts = before.split(":")
    if len(parts) not in (2, 3) or parts[0] != line or (len(parts) == 3 and not parts[2].isdigit()):
        return 0
    version = parts[1]
    return int(version) if version.isdigit() and 0 < int(version) < 2 ** 62 else 0


def label(line: str, version: int, load: int, *, loading: bool = False) -> str:
    """The label farmd's weight sync sets: ``LINE:VERSION:LOAD`` once loaded (``LOAD`` a number no earlier load
    had), ``LINE:VERSION:LOAD:loading`` before."""
    return f"{line}:{version}:{load}:loading" if loading else f"{line}:{version}:{load}"
