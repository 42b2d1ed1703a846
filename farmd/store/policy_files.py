"""Policy content in files beside the database, written as it arrives and named by its hash.

A published policy can be gigabytes: held in memory it would cost farmd its size per
upload, and SQLite refuses a value over a billion bytes and reads a blob whole. So an
upload goes to a temporary file under ``policies/`` in the data directory, hashed as
it is written; only a complete upload is moved into place, as ``policies/<sha256>``
(the same content twice is the same file). Reads go a chunk at a time.

The uploader holds an exclusive lock on its temporary file; a sweep (when the store
opens) removes only temporaries nobody holds and nobody has written to for a while:
what a crashed farmd left, never an upload in progress in another process. Every
file operation here blocks, so each runs in a worker thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import logging
import os
import secrets
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import IO, TypeVar

from farmd.private import FILE_MODE, make_dir
from farmd.text import is_sha256

log = logging.getLogger("farmd.store")

FOLDER = "policies"
_UPLOAD_PREFIX = ".upload-"
_SETTLED_S = 2.0
"""A temporary is swept only when unwritten this long: a new one is created, then locked."""

T = TypeVar("T")


class PolicyUpload:
    """One upload's temporary file: ``write`` chunks, then ``keep`` it or ``discard`` it.

    ``discard`` is safe at any moment, also after ``keep`` and while a write still runs in its
    thread (an upload whose caller was cancelled): it waits for that write, then removes the file.
    """

    def __init__(self, folder: Path, path: Path, fd: int) -> None:
        self._folder = folder
        self._path = path
        self._fd = fd
        self._hash = hashlib.sha256()
        self._lock = threading.Lock()
        self.size = 0

    @property
    def path(self) -> Path:
        """The temporary file the content is written to."""
        return self._path

    @property
    def sha256(self) -> str:
        return self._hash.hexdigest()

    async def write(self, data: bytes) -> None:
        await asyncio.to_thread(self._write, data)

    def _write(self, data: bytes) -> None:
        with self._lock:
            if self._fd < 0:
                raise ValueError("this upload was already kept or discarded")
            view = memoryview(data)
            while view:
                view = view[os.write(self._fd, view):]
            self._hash.update(data)  # hashlib lets go of the GIL for large buffers
            self.size += len(data)

    async def inspect(self, look: Callable[[IO[bytes]], T]) -> T:
        """``look`` at the content written so far, as a file open for reading (in a thread): what the
        content says of itself is checked before it is kept, never by reading it whole into memory."""
        return await asyncio.to_thread(self._inspect, look)

    def _inspect(self, look: Callable[[IO[bytes]], T]) -> T:
        fd = os.open(self._path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as content:
            return look(content)

    async def keep(self) -> str:
        """Move the content into place; returns its name relative to the data directory."""
        return await asyncio.to_thread(self._keep)

    def _keep(self) -> str:
        with self._lock:
            if self._fd < 0:
                raise ValueError("this upload was already kept or discarded")
            name = self.sha256
            fd, self._fd = self._fd, -1
            try:
                try:
                    os.fsync(fd)  # the row that will name this file must never outlive its content
                finally:
                    os.close(fd)
                os.replace(self._path, self._folder / name)
            except BaseException:
                self._path.unlink(missing_ok=True)
                raise
            _sync_dir(self._folder)
            return f"{FOLDER}/{name}"

    async def discard(self) -> None:
        await asyncio.shield(asyncio.to_thread(self._discard))

    def _discard(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
                self._path.unlink(missing_ok=True)


def _close_opened(opening: asyncio.Future[int]) -> None:
    if not opening.cancelled() and opening.exception() is None:
        os.close(opening.result())


class PolicyFiles:
    """The ``policies/`` folder of a data directory."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.folder = data_dir / FOLDER

    async def upload(self) -> PolicyUpload:
        """A new upload's temporary file. The file is made in a thread, which runs on when the caller is cancelled
        (a client that cancels as its upload starts): the upload it made is then discarded here, since no caller
        holds it to discard."""
        made = asyncio.ensure_future(asyncio.to_thread(self._upload))
        try:
            return await asyncio.shield(made)
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                await (await asyncio.shield(made)).discard()
            raise

    # What the store calls (``farmd.store.policies``, ``retention``): a store on PostgreSQL keeps content in the
    # database instead (``farmd.store.policy_chunks``), behind the same four.

    async def keep(self, upload: PolicyUpload) -> str:
        """A complete upload kept as its content; returns the name the policy's row holds."""
        return await upload.keep()

    async def remove_content(self, names: list[str]) -> int:
        """``remove``, in a thread."""
        return await asyncio.to_thread(self.remove, names)

    async def content_held(self) -> dict[str, int]:
        """``held``, in a thread."""
        return await asyncio.to_thread(self.held)

    async def content_usage(self) -> tuple[int, int]:
        """``usage``, in a thread."""
        return await asyncio.to_thread(self.usage)

    def _upload(self) -> PolicyUpload:
        make_dir(self.folder)
        path = self.folder / f"{_UPLOAD_PREFIX}{os.getpid()}-{secrets.token_hex(8)}"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE)
        fcntl.flock(fd, fcntl.LOCK_EX)
        return PolicyUpload(self.folder, path, fd)

    async def read(self, name: str, chunk_bytes: int) -> AsyncIterator[bytes]:
        """The content stored as ``name`` (as ``keep`` returned it), ``chunk_bytes`` at a time."""
        folder, _, base = name.partition("/")
        if folder != FOLDER or not is_sha256(base):
            raise ValueError(f"not a policy file: {name!r}")
        opening = asyncio.ensure_future(asyncio.to_thread(os.open, self.folder / base,
                                                          os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC))
        try:
            fd = await asyncio.shield(opening)
        except asyncio.CancelledError:  # as ``upload``: the descriptor its thread opens anyway is closed
            opening.add_done_callback(_close_opened)
            raise
        try:
            while chunk := await asyncio.to_thread(os.read, fd, chunk_bytes):
                yield chunk
        finally:
            os.close(fd)

    def remove(self, names: list[str]) -> int:
        """Remove the content stored as each of ``names`` (as ``keep`` returned them; blocking: run it in a thread).
        Returns how many bytes that gave back; a file already gone is no error (a sweep that died half way)."""
        freed = 0
        for name in names:
            path = self._path(name)
            try:
                freed += path.stat().st_size
                path.unlink()
            except FileNotFoundError:
                continue
        if names:
            with contextlib.suppress(FileNotFoundError):
                _sync_dir(self.folder)
        return freed

    def held(self) -> dict[str, int]:
        """Each complete file's hash and size (blocking: run it in a thread); uploads in progress left out."""
        found: dict[str, int] = {}
        try:
            with os.scandir(self.folder) as entries:
                for entry in entries:
                    if is_sha256(entry.name):
                        with contextlib.suppress(FileNotFoundError):
                            found[entry.name] = entry.stat(follow_symlinks=False).st_size
        except FileNotFoundError:
            pass
        return found

    def usage(self) -> tuple[int, int]:
        """(files, bytes) the folder holds now, uploads in progress included (blocking: run it in a thread)."""
        files = size = 0
        try:
            with os.scandir(self.folder) as entries:
                for entry in entries:
                    with contextlib.suppress(FileNotFoundError):
                        size += entry.stat(follow_symlinks=False).st_size
                        files += 1
        except FileNotFoundError:
            pass
        return files, size

    def _path(self, name: str) -> Path:
        folder, _, base = name.partition("/")
        if folder != FOLDER or not is_sha256(base):
            raise ValueError(f"not a policy file: {name!r}")
        return self.folder / base

    def sweep(self) -> int:
        """Remove temporaries a crashed upload left (blocking: run it in a thread). Returns how many."""
        try:
            names = [n for n in os.listdir(self.folder) if n.startswith(_UPLOAD_PREFIX)]
        except FileNotFoundError:
            return 0
        swept = 0
        for name in names:
            path = self.folder / name
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            except OSError:
                continue  # gone already, or not a plain file of ours
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue  # an upload in progress
            try:
                if time.time() - os.fstat(fd).st_mtime >= _SETTLED_S:
                    path.unlink(missing_ok=True)
                    swept += 1
                    log.warning("removed %s, left by an upload that never finished", path,
                                extra={"event": "upload_swept", "path": str(path)})
            finally:
                os.close(fd)
        return swept


def _sync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
