"""A policy blob's declared sizes are held to its bytes before torch makes anything: the few kilobytes that
declare a gigabyte model are refused with what is wrong, and the process that reads them stays small."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from farm_client import tinylm  # noqa: E402
from farm_client.tinylm_blob import PolicyFormatError, expected_shapes, read_layout  # noqa: E402

from tests.clients import policy_blobs  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("sizes", [{}, {"n_layers": 1, "d_model": 8, "n_heads": 2, "max_len": 5, "vocab": "ab"},
                                   {"n_layers": 2, "d_model": 96, "n_heads": 3}])
def test_the_shapes_a_config_makes_are_the_models_own(sizes: dict[str, object]) -> None:
    cfg = policy_blobs.config(**sizes)
    model = tinylm.TinyLM(tinylm.LMConfig(**cfg))  # type: ignore[arg-type]
    assert expected_shapes(cfg) == {k: tuple(v.shape) for k, v in model.state_dict().items()}
    blob = tinylm.save(model)
    layout = read_layout(blob)
    assert layout.parameters == sum(p.numel() for p in model.parameters())
    assert read_layout(io.BytesIO(blob)) == layout, "a file reads as its bytes do"
    loaded = tinylm.load(blob)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), loaded.state_dict().values(), strict=True))
    assert all(p.requires_grad for p in loaded.parameters()), "a loaded policy trains like a made one"


def test_a_forged_blob_that_tells_the_truth_loads() -> None:
    cfg = policy_blobs.config()
    state, records = policy_blobs.honest(cfg)
    model = tinylm.load(policy_blobs.forge(cfg, state, records))
    assert sum(p.numel() for p in model.parameters()) == read_layout(policy_blobs.forge(cfg, state, records)).parameters


def test_every_lie_about_sizes_is_refused_before_anything_is_made(tmp_path: Path) -> None:
    blobs = policy_blobs.hostile()
    for name, blob in blobs.items():
        assert len(blob) < 5 << 20, f"{name}: a hostile blob is small"
        with pytest.raises(PolicyFormatError) as refused:
            read_layout(blob)
        assert refused.value.claimed, f"{name}: it says it is a tiny LM policy, so it is a broken one"
    # Each loaded in a process of its own kind, its resident memory watched: the lie costs nothing.
    (tmp_path / "blobs.json").write_text(json.dumps({k: v.hex() for k, v in blobs.items()}))
    script = textwrap.dedent("""
        import json, resource, sys
        from farm_client import tinylm
        import torch
        blobs = {k: bytes.fromhex(v) for k, v in json.load(open(sys.argv[1])).items()}
        out = {}
        for name, blob in blobs.items():
            before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            try:
                tinylm.load(blob)
                verdict = "loaded"
            except tinylm.PolicyFormatError as exc:
                verdict = "refused: " + str(exc)
            out[name] = [(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024, verdict]
        print(json.dumps(out))
    """)
    run = subprocess.run([sys.executable, "-c", script, str(tmp_path / "blobs.json")], capture_output=True, text=True,
                         cwd=ROOT, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    seen = json.loads(run.stdout.splitlines()[-1])
    for name, (grew_mb, verdict) in seen.items():
        assert verdict.startswith("refused"), f"{name} was {verdict}"
        assert grew_mb < 64, f"{name}: loading it grew the process by {grew_mb:.0f} MB before it was refused"


def test_a_refusal_says_what_is_wrong() -> None:
    blobs = policy_blobs.hostile()
    reasons = {}
    for name, blob in blobs.items():
        with pytest.raises(PolicyFormatError) as refused:
            read_layout(blob)
        reasons[name] = str(refused.value)
    assert "do not fit the config" in reasons["config-of-a-large-model"]
    assert "contiguous" in reasons["views-of-one-element"]
    assert "compressed" in reasons["deflated-records"]
    assert "not a zip archive" in reasons["legacy-format"]
    over = policy_blobs.config(d_model=2048, n_layers=48, n_heads=16)
    state, records = policy_blobs.honest(policy_blobs.config(n_layers=1))
    with pytest.raises(PolicyFormatError, match="parameters; a policy has at most"):
        read_layout(policy_blobs.forge(over, state, records))


def test_content_that_is_no_tiny_lm_policy_is_not_claimed() -> None:
    for content in (b"weights-1", b"PK\x03\x04 not really", b"\x00" * 100):
        with pytest.raises(PolicyFormatError) as refused:
            read_layout(content)
        assert not refused.value.claimed
    other = io.BytesIO()
    torch.save({"format": "someone-elses/2", "weights": torch.zeros(3)}, other)
    with pytest.raises(PolicyFormatError) as refused:
        read_layout(other.getvalue())
    assert not refused.value.claimed
