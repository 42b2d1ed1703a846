"""The static scan of a contributed environment's source: each smell of an unsound verifier is named
with its line; the honest example shows none."""

from __future__ import annotations

import pytest

from farmd.intake.package import Package, pack, read_package
from farmd.intake.scan import scan_package
from tests.intake.contrib_example import WORD_COUNT, files


def package(source: str) -> Package:
    found = {**files(), "env.py": source}
    return read_package(pack((k, v.encode()) for k, v in found.items()))


VERIFY = '''    def verify(self, task, final):
        ok = final.strip() == str(task["hidden"]["count"])
        return {"reward": 1.0 if ok else 0.0, "passed": ok, "reasons": ["right" if ok else "wrong count"]}
'''


def with_verify(body: str) -> str:
    assert VERIFY in WORD_COUNT
    return WORD_COUNT.replace(VERIFY, "    def verify(self, task, final):\n" + body)


@pytest.mark.parametrize(("body", "check"), [
    ('        return {"reward": 1.0, "passed": True, "reasons": []}\n', "scan_constant_verdict"),
    ('        import subprocess\n        out = subprocess.run(["python3", "-c", final], capture_output=True)\n'
     '        return {"reward": 1.0, "passed": "PASS" in out.stdout.decode(), "reasons": []}\n', "scan_stdout_verdict"),
    ('        try:\n            ok = int(final) == task["hidden"]["count"]\n        except Exception:\n'
     '            return {"reward": 1.0, "passed": True, "reasons": ["could not tell"]}\n'
     '        return {"reward": float(ok), "passed": ok, "reasons": []}\n', "scan_exception_passes"),
    ('        key = open("/var/lib/farm/verifier.key").read()\n'
     '        return {"reward": 0.0, "passed": False, "reasons": [key]}\n', "scan_outside_files"),
    ('        import os\n        return {"reward": 0.0, "passed": os.environ.get("X") == final, "reasons": []}\n',
     "scan_outside_files"),
    ('        return {"reward": 1.0, "passed": True\n', "scan_parses"),
])
def test_each_smell_is_named_with_its_line(body: str, check: str) -> None:
    findings = scan_package(package(with_verify(body)))
    assert check in {f.check for f in findings}, findings
    assert all("env.py:" in f.evidence for f in findings)


def test_the_example_has_no_smell() -> None:
    assert scan_package(package(WORD_COUNT)) == []
