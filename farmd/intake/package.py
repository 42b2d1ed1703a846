"""A submitted environment as farm receives it: a directory or a tarball, read into memory and checked
before anything in it runs.

A submission is untrusted from its first byte. Reading one never follows a link, never writes a file,
never trusts a path or a size it states: every member is a plain file under a relative, normalised
name, within the bounds below, and its text is UTF-8. A tarball is read as a bounded stream: it is
inflated only up to ``MAX_TAR_BYTES`` of output (a gzip, bzip2 or xz bomb stops there), and no single
read of it (a member's content, a pax or GNU long-name header's data) takes more than ``MAX_READ_BYTES``
whatever its header declares: a header that declares more is refused, not followed. What comes out is a ``Package``: the manifest,
parsed and checked, and the files by name, with a digest over both that names this exact version.
Every problem found is reported together (``PackageError.problems``), each saying what to fix, so a
contributor fixes a submission in one round, not one problem per round.

The manifest, ``farm-env.toml``::

    name = "word-count"            # lowercase letters, digits and '-': the environment's name in farm
    version = "1.0.0"
    domain = "text"
    author = "ada@example.org"
    levels = 3                     # difficulty levels 1..levels
    kind = "answer"                # what an attempt submits: answer, function, bare-answer
    entry = "env.py:WordCount"     # the file and class implementing the Environment API

    [bounds]                       # what one call of the environment's own code may take, in its box
    generate_s = 2.0
    verify_s = 10.0
    memory_mb = 256

    [examples]                     # attempts that must pass, and must fail (JSON, one per file)
    good = ["examples/good"]
    bad = ["examples/bad"]

A package in verifiers' form says so in its manifest (``form = "verifiers"``): its ``entry`` names the module
and its ``load_environment`` function (``arith.py:load_environment``), ``[env_args]`` the keyword arguments that
function is called with, and it has one level (a verifiers dataset has no difficulty); ``kind`` defaults to
``answer`` and the bounds to what importing verifiers takes in a box (``VERIFIERS_BOUNDS``). A directory with no
manifest but one module defining ``load_environment`` is read as one too, by ``read_verifiers_package`` (an
operator's own environment, ``[verifiers]`` in farm.toml): its manifest is made from that shape.
"""

from __future__ import annotations

import bz2
import hashlib
import io
import json
import lzma
import posixpath
import re
import tarfile
import tomllib
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from farmd import syntax
from farmd.errors import PackageError

MANIFEST = "farm-env.toml"
MAX_FILES = 256
MAX_FILE_BYTES = 1 << 20
MAX_TOTAL_BYTES = 4 << 20
MAX_NAME_CHARS = 200
MAX_DEPTH = 8
MAX_READ_BYTES = 64 << 10
"""The most one read of a tarball takes: a member's content is read this much at a time, and a pax or GNU
long-name header's data (a name is at most ``MAX_NAME_CHARS``) must fit in one."""
MAX_TAR_BYTES = 2 * MAX_TOTAL_BYTES + 4 * 1024 * MAX_FILES
"""A tarball inflated: the files' bytes, their headers and padding, with room to spare; past it, a bomb."""
MAX_LEVELS = 10
KINDS = ("answer", "function", "bare-answer")
"""Submission kinds a contributed environment may declare: the exploit library has attacks for each."""
BOUNDS = {"generate_s": (0.1, 30.0, 2.0), "verify_s": (0.1, 120.0, 10.0), "memory_mb": (32, 4096, 256)}
"""Each bound: (least, most, default)."""

_ENV_NAME = re.compile(r"[a-z][a-z0-9-]{1,39}")
_VERSION = re.compile(r"\d{1,6}(\.\d{1,6}){0,3}")
_ENTRY = re.compile(r"([A-Za-z0-9_./-]{1,200}\.py):([A-Za-z_][A-Za-z0-9_]{0,99})")
_MEMBER = re.compile(r"[A-Za-z0-9_.-]+")
_KEYS = {"name", "version", "domain", "author", "levels", "kind", "entry", "bounds", "examples", "form", "env_args"}
FORMS = ("farm", "verifiers")
"""What a package's entry is: a class with generate, reference and verify (farm's own), or a module's
``load_environment`` returning a verifiers environment."""
VERIFIERS_BOUNDS = {"generate_s": 10.0, "verify_s": 10.0, "memory_mb": 1024.0}
"""A verifiers package's default bounds: its own code's seconds (``load_environment`` and the call; importing
verifiers is farm's, bounded apart), and memory for a process that has imported verifiers (datasets, openai,
pydantic...: some 270 MB before the environment's code runs)."""
MAX_ENV_ARGS_CHARS = 4096
_BUILT_IN = ("py-func", "kernel", "shell", "arith", "rg")


@dataclass(frozen=True)
class Manifest:
    name: str
    version: str
    domain: str
    author: str
    levels: int
    kind: str
    entry_file: str
    entry_class: str
    bounds: dict[str, float] = field(default_factory=dict)
    good: tuple[str, ...] = ()
    bad: tuple[str, ...] = ()
    form: str = "farm"
    """``farm`` (``entry`` is a class) or ``verifiers`` (``entry`` is ``load_environment``)."""
    env_args: dict[str, Any] = field(default_factory=dict)
    """A verifiers package's keyword arguments to ``load_environment``."""

    @property
    def env_name(self) -> str:
        """Its name in farm: contributed environments live apart from the built-in ones."""
        return f"contrib:{self.name}"


@dataclass(frozen=True)
class Package:
    manifest: Manifest
    files: dict[str, bytes]
    digest: str
    """sha256 over every file's name and content, in name order: this exact version."""

    def examples(self, which: str) -> list[tuple[str, bytes]]:
        """(name, content) of the files under the manifest's ``good`` or ``bad`` directories."""
        roots = self.manifest.good if which == "good" else self.manifest.bad
        return [(name, data) for name, data in sorted(self.files.items())
                if any(name.startswith(root.rstrip("/") + "/") for root in roots)]


def _member_name(raw: str, problems: list[str]) -> str | None:
    """``raw`` as a safe relative name, or None (with the problem noted)."""
    name = posixpath.normpath(raw.replace("\\", "/")).removeprefix("./")
    parts = name.split("/")
    if (raw.startswith("/") or name.startswith("../") or name == ".." or len(raw) > MAX_NAME_CHARS
            or len(parts) > MAX_DEPTH or not all(_MEMBER.fullmatch(p) and p not in (".", "..") for p in parts)):
        problems.append(f"{raw[:80]!r} is not a plain relative path of letters, digits, '.', '_' and '-' "
                        f"(at most {MAX_DEPTH} deep): rename it")
        return None
    return name


def _add(files: dict[str, bytes], name: str | None, data: bytes, problems: list[str]) -> None:
    if name is None:
        return
    if len(data) > MAX_FILE_BYTES:
        problems.append(f"{name} is {len(data)} bytes; a file is at most {MAX_FILE_BYTES}")
        return
    if name in files:
        problems.append(f"{name} appears twice")
        return
    files[name] = data


def _from_dir(root: Path, problems: list[str]) -> dict[str, bytes]:
    files: dict[str, bytes] = {}
    total = 0
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if path.is_symlink():
            problems.append(f"{rel} is a link: a submission holds plain files only")
            continue
        if path.is_dir():
            continue
        if not path.is_file():
            problems.append(f"{rel} is not a plain file")
            continue
        if len(files) >= MAX_FILES:
            problems.append(f"more than {MAX_FILES} files")
            break
        size = path.stat().st_size
        total += size
        if total > MAX_TOTAL_BYTES:
            problems.append(f"more than {MAX_TOTAL_BYTES} bytes in all")
            break
        with path.open("rb") as fh:
            data = fh.read(MAX_FILE_BYTES + 1)
        _add(files, _member_name(rel, problems), data, problems)
    return files


class _Refused(Exception):
    """A tarball that declares or inflates past a bound: reading stops at once."""


class _Guarded(io.BytesIO):
    """An inflated tarball that refuses any one read past ``MAX_READ_BYTES``: tarfile reads a header's declared
    size in one call, so a declared size past the bound ends the reading before anything is taken."""

    def read(self, size: int | None = -1, /) -> bytes:
        if size is None or size < 0 or size > MAX_READ_BYTES:
            raise _Refused(f"a tar header declares {size} bytes of data; a name or header holds at most "
                           f"{MAX_READ_BYTES}")
        return super().read(size)


def _inflated(blob: bytes) -> bytes:
    """``blob`` as a plain tar stream: gzip, bzip2 and xz inflated, never past ``MAX_TAR_BYTES`` of output."""
    make: Callable[[], Any] | None = None
    if blob.startswith(b"\x1f\x8b"):
        make = lambda: zlib.decompressobj(16 + zlib.MAX_WBITS)  # noqa: E731
    elif blob.startswith(b"BZh"):
        make = bz2.BZ2Decompressor
    elif blob.startswith(b"\xfd7zXZ\x00"):
        make = lambda: lzma.LZMADecompressor(lzma.FORMAT_XZ)  # noqa: E731
    if make is None:
        return blob
    out = bytearray()
    data = blob
    while data:  # concatenated streams (gzip members, bzip2 streams) each in turn
        inflater = make()
        out += inflater.decompress(data, MAX_TAR_BYTES + 1 - len(out))
        if len(out) > MAX_TAR_BYTES:
            raise _Refused(f"the tarball inflates past {MAX_TAR_BYTES} bytes: more than a submission holds")
        if not inflater.eof:
            raise _Refused("the tarball's compressed stream is cut short")
        data = inflater.unused_data.lstrip(b"\x00")  # gzip writers may pad the end with zeros
    return bytes(out)


def _from_tar(blob: bytes, problems: list[str]) -> dict[str, bytes]:
    files: dict[str, bytes] = {}
    total = 0
    try:
        stream = _Guarded(_inflated(blob))
        with tarfile.open(fileobj=stream, mode="r:") as tar:
            for count, member in enumerate(tar):
                if count >= MAX_FILES * 2:
                    problems.append(f"more than {MAX_FILES} files")
                    break
                if member.isdir():
                    continue
                if not member.isfile() or member.sparse is not None:
                    problems.append(f"{member.name[:80]!r} is a link or a device: a submission holds plain files only")
                    continue
                total += member.size
                if total > MAX_TOTAL_BYTES:
                    problems.append(f"more than {MAX_TOTAL_BYTES} bytes in all")
                    break
                name = _member_name(member.name, problems)
                if member.size > MAX_FILE_BYTES:
                    problems.append(f"{member.name[:80]} is {member.size} bytes; a file is at most {MAX_FILE_BYTES}")
                    continue
                _add(files, name, _content(tar, member), problems)
                if len(files) > MAX_FILES:
                    problems.append(f"more than {MAX_FILES} files")
                    break
    except _Refused as exc:
        problems.append(f"not a tarball farm reads: {exc}")
    except (tarfile.TarError, EOFError, OSError, ValueError, RecursionError, lzma.LZMAError, zlib.error) as exc:
        problems.append(f"not a readable tarball: {str(exc)[:200]}")
    return files


def _content(tar: tarfile.TarFile, member: tarfile.TarInfo) -> bytes:
    """A member's content (its size is checked first), read ``MAX_READ_BYTES`` at a time."""
    extracted = tar.extractfile(member)
    if extracted is None:
        return b""
    parts = []
    while chunk := extracted.read(MAX_READ_BYTES):
        parts.append(chunk)
    return b"".join(parts)


def _strip_top(files: dict[str, bytes]) -> dict[str, bytes]:
    """A tarball of a directory holds ``dir/farm-env.toml``: its files are taken from inside ``dir``."""
    if MANIFEST in files or not files:
        return files
    tops = {name.split("/", 1)[0] for name in files}
    if len(tops) == 1 and all("/" in name for name in files):
        top = next(iter(tops)) + "/"
        return {name.removeprefix(top): data for name, data in files.items()}
    return files


def _text(value: Any, key: str, problems: list[str], limit: int = 200) -> str:
    if not isinstance(value, str) or not value.strip() or len(value) > limit:
        problems.append(f"{key} must be text of 1 to {limit} characters")
        return ""
    return value


def _manifest(raw: dict[str, Any], files: dict[str, bytes], problems: list[str]) -> Manifest | None:
    unknown = sorted(set(raw) - _KEYS)
    if unknown:
        problems.append(f"{MANIFEST} has unknown keys {unknown}; known: {sorted(_KEYS)}")
    form = raw.get("form", "farm")
    if form not in FORMS:
        problems.append(f"form must be one of {list(FORMS)}, not {str(form)[:40]!r}")
        form = "farm"
    verifiers = form == "verifiers"
    env_args = _env_args(raw.get("env_args", {}), verifiers, problems)
    if verifiers:
        raw = {"kind": "answer", "levels": 1, **raw}
        if raw["levels"] != 1:
            problems.append("a verifiers package has levels = 1: its dataset has no difficulty")
    name = _text(raw.get("name"), "name", problems, 40)
    if name and not _ENV_NAME.fullmatch(name):
        problems.append(f"name {name!r}: 2-40 lowercase letters, digits and '-', starting with a letter")
    if name and any(name == b or name.startswith(b + "-") for b in _BUILT_IN):
        problems.append(f"name {name!r} is too close to a built-in environment's: choose another")
    version = _text(raw.get("version"), "version", problems, 40)
    if version and not _VERSION.fullmatch(version):
        problems.append(f"version {version!r}: numbers joined by '.', such as 1.0.0")
    levels = raw.get("levels")
    if isinstance(levels, bool) or not isinstance(levels, int) or not 1 <= levels <= MAX_LEVELS:
        problems.append(f"levels must be a whole number from 1 to {MAX_LEVELS}")
        levels = 1
    kind = raw.get("kind")
    if kind not in KINDS:
        problems.append(f"kind must be one of {list(KINDS)}, not {str(kind)[:40]!r}")
    entry = _text(raw.get("entry"), "entry", problems, 300)
    match = _ENTRY.fullmatch(entry) if entry else None
    if entry and match is None:
        problems.append(f"entry {entry[:80]!r}: FILE.py:ClassName")
    elif match and match.group(1) not in files:
        problems.append(f"entry names {match.group(1)}, which the submission does not hold")
    bounds = _bounds(raw.get("bounds", {}), problems, VERIFIERS_BOUNDS if verifiers else None)
    good, bad = _examples(raw.get("examples", {}), files, problems)
    if problems:
        return None
    assert match is not None
    return Manifest(name=name, version=version, domain=_text(raw.get("domain"), "domain", problems, 60),
                    author=_text(raw.get("author"), "author", problems), levels=levels, kind=str(kind),
                    entry_file=match.group(1), entry_class=match.group(2), bounds=bounds, good=good, bad=bad,
                    form=str(form), env_args=env_args)


def _env_args(table: Any, verifiers: bool, problems: list[str]) -> dict[str, Any]:
    """``[env_args]``: a verifiers package's, JSON-able and small (it travels in every box's request)."""
    if not table:
        return {}
    if not verifiers:
        problems.append("[env_args] is for a verifiers package (form = \"verifiers\")")
        return {}
    if not isinstance(table, dict):
        problems.append("[env_args] must be a table")
        return {}
    try:
        text = json.dumps(table)
    except (TypeError, ValueError):
        problems.append("[env_args] holds values that are not JSON (dates, times)")
        return {}
    if len(text) > MAX_ENV_ARGS_CHARS:
        problems.append(f"[env_args] is {len(text)} characters as JSON; at most {MAX_ENV_ARGS_CHARS}")
        return {}
    return dict(json.loads(text))


def _bounds(table: Any, problems: list[str], defaults: dict[str, float] | None = None) -> dict[str, float]:
    if not isinstance(table, dict):
        problems.append("[bounds] must be a table")
        return {}
    out = {}
    for key, (least, most, default) in BOUNDS.items():
        value = table.get(key, (defaults or {}).get(key, default))
        if isinstance(value, bool) or not isinstance(value, int | float) or not least <= value <= most:
            problems.append(f"bounds.{key} must be a number from {least} to {most}")
            continue
        out[key] = float(value)
    for key in sorted(set(table) - set(BOUNDS)):
        problems.append(f"[bounds] has no setting {key!r}; known: {sorted(BOUNDS)}")
    return out


def _examples(table: Any, files: dict[str, bytes], problems: list[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    if not isinstance(table, dict):
        problems.append("[examples] must be a table")
        return (), ()
    found: dict[str, tuple[str, ...]] = {}
    for which in ("good", "bad"):
        roots = table.get(which, [])
        if not isinstance(roots, list) or not all(isinstance(r, str) for r in roots):
            problems.append(f"examples.{which} must be a list of directories")
            roots = []
        for root in roots:
            prefix = root.strip("/") + "/"
            if not any(name.startswith(prefix) for name in files):
                problems.append(f"examples.{which} names {root[:80]!r}, which holds no file")
        found[which] = tuple(r.strip("/") for r in roots)
        if not found[which]:
            problems.append(f"examples.{which}: a submission shows at least one {which} attempt")
    return found["good"], found["bad"]


def _digest(files: dict[str, bytes]) -> str:
    h = hashlib.sha256()
    for name in sorted(files):
        h.update(name.encode() + b"\0" + len(files[name]).to_bytes(8, "big") + files[name])
    return h.hexdigest()


def read_package(source: Path | bytes) -> Package:
    """The submission at ``source`` (a directory, a tarball's path, or a tarball's bytes), checked.
    Blocking: call it in a thread. Raises ``PackageError`` with every problem found."""
    problems: list[str] = []
    if isinstance(source, bytes):
        if len(source) > MAX_TOTAL_BYTES * 2:
            raise PackageError([f"the tarball is {len(source)} bytes; at most {MAX_TOTAL_BYTES * 2}"])
        files = _from_tar(source, problems)
    elif source.is_dir():
        files = _from_dir(source, problems)
    else:
        if source.stat().st_size > MAX_TOTAL_BYTES * 2:
            raise PackageError([f"{source.name} is larger than {MAX_TOTAL_BYTES * 2} bytes"])
        files = _from_tar(source.read_bytes(), problems)
    files = _strip_top(files)
    for name, data in files.items():
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            problems.append(f"{name} is not UTF-8 text: a submission is source and examples")
    if MANIFEST not in files:
        problems.append(f"no {MANIFEST} at the top: every submission starts with its manifest")
        raise PackageError(problems)
    try:
        raw = tomllib.loads(files[MANIFEST].decode("utf-8", errors="replace"))
    except tomllib.TOMLDecodeError as exc:
        raise PackageError([*problems, f"{MANIFEST} is not valid TOML: {exc}"]) from None
    manifest = _manifest(raw, files, problems)
    if problems or manifest is None:
        raise PackageError(problems)
    return Package(manifest, files, _digest(files))


def pack(files: Iterable[tuple[str, bytes]]) -> bytes:
    """A gzipped tarball of ``files`` (what ``farmctl submit`` sends for a directory)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for name, data in sorted(files):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def _defines_load_environment(source: bytes) -> bool:
    import ast

    try:
        tree = syntax.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    return any(isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == "load_environment"
               for node in tree.body)


def read_verifiers_package(source: Path, name: str) -> Package:
    """An operator's verifiers environment at the directory ``source``, to be served as ``vf:NAME``: with a
    manifest, that manifest (it must say ``form = "verifiers"``); without one, its one top-level module that
    defines ``load_environment`` (the module's shape decides), version from its pyproject.toml if it has one.
    Blocking: call it in a thread. Raises ``PackageError`` with every problem found."""
    if not _ENV_NAME.fullmatch(name):
        raise PackageError([f"verifiers environment name {name[:80]!r}: 2-40 lowercase letters, digits and '-', "
                            "starting with a letter"])
    if not source.is_dir():
        raise PackageError([f"{source} is not a directory: a verifiers environment is served from its directory"])
    if (source / MANIFEST).exists():
        package = read_package(source)
        if package.manifest.form != "verifiers":
            raise PackageError([f"{source / MANIFEST} does not say form = \"verifiers\""])
        return package
    problems: list[str] = []
    files = _from_dir(source, problems)
    for rel, data in files.items():
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            problems.append(f"{rel} is not UTF-8 text")
    modules = sorted(rel for rel, data in files.items()
                     if "/" not in rel and rel.endswith(".py") and _defines_load_environment(data))
    if len(modules) != 1:
        problems.append(f"{len(modules)} top-level modules define load_environment ({', '.join(modules[:4])}); "
                        "a verifiers environment has one")
    if problems:
        raise PackageError(problems)
    version = "0"
    if "pyproject.toml" in files:
        try:
            project = tomllib.loads(files["pyproject.toml"].decode()).get("project", {})
        except tomllib.TOMLDecodeError as exc:
            raise PackageError([f"pyproject.toml is not valid TOML: {exc}"]) from None
        raw_version = project.get("version") if isinstance(project, dict) else None
        if isinstance(raw_version, str) and _VERSION.fullmatch(raw_version):
            version = raw_version
    manifest = Manifest(name=name, version=version, domain="verifiers", author="operator", levels=1, kind="answer",
                        entry_file=modules[0], entry_class="load_environment", bounds=dict(VERIFIERS_BOUNDS),
                        form="verifiers")
    return Package(manifest, files, _digest(files))
