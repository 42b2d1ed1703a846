"""Reading a submitted environment: a directory or a tarball becomes a checked package, or every problem
with it is listed; nothing in it is followed, written or trusted before it is checked."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path

import pytest

from farmd.errors import PackageError
from farmd.intake.package import MANIFEST, MAX_FILE_BYTES, MAX_READ_BYTES, pack, read_package
from tests.intake import hostile_tars
from tests.intake.contrib_example import MANIFEST_TEXT

FILES = {
    MANIFEST: MANIFEST_TEXT.encode(),
    "env.py": b"class WordCount:\n    pass\n",
    "examples/good/1.json": b'{"seed": 1, "difficulty": 1, "final": "3"}',
    "examples/bad/1.json": b'{"seed": 1, "difficulty": 1, "final": "4"}',
}


def write(root: Path, files: dict[str, bytes]) -> Path:
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return root


def tarball(members: list[tarfile.TarInfo], data: dict[str, bytes] | None = None) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for member in members:
            body = (data or {}).get(member.name, b"")
            member.size = len(body) if member.isfile() else 0
            tar.addfile(member, io.BytesIO(body) if member.isfile() else None)
    return out.getvalue()


def test_a_directory_and_its_tarball_are_the_same_package(tmp_path: Path) -> None:
    from_dir = read_package(write(tmp_path / "wc", FILES))
    m = from_dir.manifest
    assert (m.env_name, m.version, m.levels, m.kind, m.entry_file, m.entry_class) == (
        "contrib:word-count", "1.0.0", 3, "answer", "env.py", "WordCount")
    assert m.bounds == {"generate_s": 2.0, "verify_s": 2.0, "memory_mb": 256.0}
    assert [n for n, _ in from_dir.examples("good")] == ["examples/good/1.json"]
    from_tar = read_package(pack((f"wc/{n}", d) for n, d in FILES.items()))  # a tarball of the directory
    assert from_tar.digest == from_dir.digest and from_tar.files == from_dir.files
    changed = read_package(pack({**FILES, "env.py": b"class WordCount:\n    x = 1\n"}.items()))
    assert changed.digest != from_dir.digest, "a digest names one exact version"


@pytest.mark.parametrize(("change", "problem"), [
    ({"name": '"py-func-2"'}, "too close to a built-in"),
    ({"name": '"Word Count"'}, "lowercase letters"),
    ({"levels": "0"}, "levels must be"),
    ({"kind": '"shell"'}, "kind must be one of"),
    ({"entry": '"missing.py:WordCount"'}, "does not hold"),
    ({"entry": '"env.py"'}, "FILE.py:ClassName"),
    ({"colour": '"blue"'}, "unknown keys ['colour']"),
])
def test_each_bad_manifest_field_is_named(tmp_path: Path, change: dict[str, str], problem: str) -> None:
    lines = [line for line in MANIFEST_TEXT.splitlines() if line.split(" = ")[0] not in change]
    text = "\n".join(f"{k} = {v}" for k, v in change.items()) + "\n" + "\n".join(lines)
    with pytest.raises(PackageError) as refused:
        read_package(write(tmp_path / "wc", {**FILES, MANIFEST: text.encode()}))
    assert any(problem in p for p in refused.value.problems), refused.value.problems


def test_every_problem_is_listed_at_once(tmp_path: Path) -> None:
    text = MANIFEST_TEXT.replace('levels = 3', 'levels = 99').replace('kind = "answer"', 'kind = "?"')
    text = text.replace("verify_s = 2", "verify_s = 5000\nwall_s = 1").replace('bad = ["examples/bad"]', "bad = []")
    with pytest.raises(PackageError) as refused:
        read_package(write(tmp_path / "wc", {**FILES, MANIFEST: text.encode()}))
    problems = " | ".join(refused.value.problems)
    for expected in ("levels must be", "kind must be", "bounds.verify_s", "no setting 'wall_s'", "examples.bad"):
        assert expected in problems


def test_links_traversal_devices_and_oversized_files_are_refused(tmp_path: Path) -> None:
    root = write(tmp_path / "wc", FILES)
    os.symlink("/etc/passwd", root / "passwd")
    with pytest.raises(PackageError, match="passwd is a link"):
        read_package(root)
    ok = tarfile.TarInfo("wc/farm-env.toml")
    members = [ok, tarfile.TarInfo("../../escape.py"), tarfile.TarInfo("/abs.py")]
    link = tarfile.TarInfo("wc/key")
    link.type, link.linkname = tarfile.SYMTYPE, "/var/lib/farm/verifier.key"
    device = tarfile.TarInfo("wc/null")
    device.type = tarfile.CHRTYPE
    with pytest.raises(PackageError) as refused:
        read_package(tarball([*members, link, device], {"wc/farm-env.toml": MANIFEST_TEXT.encode()}))
    problems = " | ".join(refused.value.problems)
    assert "'../../escape.py' is not a plain relative path" in problems and "'/abs.py'" in problems
    assert "'wc/key' is a link" in problems and "'wc/null' is a link or a device" in problems
    assert not (tmp_path.parent / "escape.py").exists()
    with pytest.raises(PackageError, match="a file is at most"):
        read_package(write(tmp_path / "big", {**FILES, "data.txt": b"x" * (MAX_FILE_BYTES + 1)}))
    with pytest.raises(PackageError, match="not UTF-8"):
        read_package(write(tmp_path / "bin", {**FILES, "blob.py": b"\xff\xfe"}))
    with pytest.raises(PackageError, match="not a readable tarball"):
        read_package(b"not a tarball at all")
    with pytest.raises(PackageError, match=r"no farm-env\.toml"):
        read_package(pack([("env.py", b"")]))


def test_a_tarball_is_read_as_a_bounded_stream_whatever_its_headers_declare(tmp_path: Path) -> None:
    """GNU long names and long link names, pax headers and pax global headers that declare 128 MiB (sent as
    kilobytes of gzip, bzip2 or xz), and a member of zeros past any submission: each is refused, and reading it
    costs a bounded few megabytes, not what it declares."""
    tars = hostile_tars.hostile()
    for name, blob in tars.items():
        assert len(blob) < 1 << 20, name
        with pytest.raises(PackageError, match="not a tarball farm reads"):
            read_package(blob)
    (tmp_path / "tars.json").write_text(json.dumps({k: v.hex() for k, v in tars.items()}))
    script = textwrap.dedent("""
        import json, resource, sys, time
        from farmd.intake.package import read_package
        from farmd.errors import PackageError
        tars = {k: bytes.fromhex(v) for k, v in json.load(open(sys.argv[1])).items()}
        out = {}
        for name, blob in tars.items():
            before, started = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, time.monotonic()
            try:
                read_package(blob)
                verdict = "read"
            except PackageError as exc:
                verdict = str(exc)
            out[name] = [(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024,
                         time.monotonic() - started, verdict]
        print(json.dumps(out))
    """)
    run = subprocess.run([sys.executable, "-c", script, str(tmp_path / "tars.json")], capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    for name, (grew_mb, took_s, verdict) in json.loads(run.stdout.splitlines()[-1]).items():
        assert "not a tarball farm reads" in verdict, f"{name}: {verdict}"
        assert grew_mb < 40, f"{name}: reading it grew the process by {grew_mb:.0f} MB"
        assert took_s < 5, f"{name}: reading it took {took_s:.1f} s"


@pytest.mark.parametrize("typeflag", [b"L", b"K", b"x", b"g"])
def test_a_header_that_declares_more_than_a_name_needs_is_refused_before_it_is_read(typeflag: bytes) -> None:
    declared = MAX_READ_BYTES + 1
    plain = hostile_tars.header(b"././@LongLink", declared, typeflag) + bytes(declared + (-declared % 512)) \
        + bytes(1024)
    with pytest.raises(PackageError, match=r"a tar header declares \d+ bytes of data; a name or header holds at most"):
        read_package(plain)


@pytest.mark.parametrize("fmt", [tarfile.PAX_FORMAT, tarfile.GNU_FORMAT])
def test_long_names_in_pax_and_gnu_headers_still_read(fmt: int) -> None:
    long_name = "examples/good/" + "a" * 150 + ".json"
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz", format=fmt) as tar:
        for name, data in {**FILES, long_name: FILES["examples/good/1.json"]}.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    package = read_package(out.getvalue())
    assert long_name in package.files and package.files[long_name] == FILES["examples/good/1.json"]
