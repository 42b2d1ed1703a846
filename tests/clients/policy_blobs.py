"""Policy blobs forged byte by byte: what a hostile trainer can publish, declaring sizes its bytes do not hold.

``forge`` writes the archive ``torch.save`` writes (torch's own zip writer, the same records), with a pickle
made here: a config, and tensors described by whatever storage, offset, size and strides the test says,
backed by whatever records it says. Nothing declared is ever made while forging.
"""

from __future__ import annotations

import collections
import io
import pickle
import zipfile
from dataclasses import dataclass
from typing import Any

import torch
from farm_client import tinylm
from farm_client.tinylm_blob import expected_shapes


@dataclass(frozen=True)
class Storage:
    key: str
    numel: int
    kind: Any = torch.FloatStorage


@dataclass(frozen=True)
class Tensor:
    storage: Storage
    size: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int = 0

    def __reduce__(self) -> tuple[Any, ...]:
        return (torch._utils._rebuild_tensor_v2,
                (self.storage, self.offset, self.size, self.stride, False, collections.OrderedDict()))


class _Pickler(pickle.Pickler):
    def persistent_id(self, obj: Any) -> Any:
        if isinstance(obj, Storage):
            return ("storage", obj.kind, obj.key, "cpu", obj.numel)
        return None


def config(**sizes: Any) -> dict[str, Any]:
    return {"vocab": tinylm.ARITH_VOCAB, "d_model": 64, "n_layers": 3, "n_heads": 4, "max_len": 32, **sizes}


def forge(cfg: dict[str, Any], state: dict[str, Tensor], records: dict[str, bytes], *,
          fmt: str = tinylm.FORMAT) -> bytes:
    """A blob whose pickle says ``cfg`` and ``state`` and whose ``data/`` records are ``records``."""
    buf = io.BytesIO()
    _Pickler(buf, protocol=2).dump({"format": fmt, "config": cfg, "state": state})
    out = io.BytesIO()
    writer = torch._C.PyTorchFileWriter(out)  # type: ignore[attr-defined]
    writer.write_record("data.pkl", buf.getvalue(), len(buf.getvalue()))
    writer.write_record("byteorder", b"little", 6)
    for key, data in records.items():
        writer.write_record(f"data/{key}", data, len(data))
    writer.write_end_of_file()
    return out.getvalue()


def deflated(blob: bytes, zeros: dict[str, int] | None = None) -> bytes:
    """``blob``'s archive with every member deflated (torch reads those too, inflating whatever they declare);
    the records named in ``zeros`` hold that many zero bytes instead (written a megabyte at a time)."""
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(blob)) as src, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as dst:
        for info in src.infolist():
            key = info.filename.rpartition("data/")[2] if "/data/" in info.filename else None
            if zeros and key in zeros:
                with dst.open(info.filename, "w", force_zip64=True) as member:
                    chunk = bytes(1 << 20)
                    for _ in range(zeros[key] >> 20):
                        member.write(chunk)
            else:
                dst.writestr(info.filename, src.read(info))
    return out.getvalue()


def honest(cfg: dict[str, Any]) -> tuple[dict[str, Tensor], dict[str, bytes]]:
    """The state and records of a real model of ``cfg`` (zeros): what the forged ones differ from."""
    state, records = {}, {}
    for i, (name, shape) in enumerate(expected_shapes(cfg).items()):
        numel = 1
        for s in shape:
            numel *= s
        state[name] = Tensor(Storage(str(i), numel), shape, _contiguous(shape))
        records[str(i)] = bytes(4 * numel)
    return state, records


def _contiguous(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 1
    for s in reversed(shape):
        strides.append(step)
        step *= s
    return tuple(reversed(strides))


def hostile() -> dict[str, bytes]:
    """One blob of each class of lie, each a few kilobytes (or less than a megabyte) that declares a gigabyte."""
    big = config(d_model=2048, n_layers=5, n_heads=16)  # 252M parameters: about 1 GB of float32
    small_state, small_records = honest(config(n_layers=1))
    views = {name: Tensor(Storage(str(i), 1), t.size, tuple(0 for _ in t.size))
             for i, (name, t) in enumerate(honest(big)[0].items())}
    bomb_state, bomb_records = honest(config(n_layers=1))
    bomb_state["embed.weight"] = Tensor(Storage("0", 256 << 20), (256 << 20,), (1,))
    bomb_records["0"] = b""
    legacy = io.BytesIO()
    torch.save({"format": tinylm.FORMAT, "config": config(), "state": {"x": torch.zeros(4)}}, legacy,
               _use_new_zipfile_serialization=False)
    out = {
        # The issue's own: a config of a gigabyte model and a state of nothing like it.
        "config-of-a-large-model": forge(big, small_state, small_records),
        # The state matches the large config, each tensor a view of one element repeated.
        "views-of-one-element": forge(big, views, {str(i): bytes(4) for i in range(len(views))}),
        # Storages that declare a billion elements and hold sixteen bytes each.
        "storages-larger-than-their-records": forge(
            config(n_layers=1), {n: Tensor(Storage(str(i), 1 << 28), t.size, t.stride)
                                 for i, (n, t) in enumerate(small_state.items())},
            {str(i): bytes(16) for i in range(len(small_state))}),
        # A gigabyte of zeros deflated to about a megabyte.
        "deflated-records": deflated(forge(config(n_layers=1), bomb_state, bomb_records), zeros={"0": 1 << 30}),
        # torch's legacy format, whose pickle sizes its storages before their data is read.
        "legacy-format": _legacy_lie(legacy.getvalue()),
    }
    return out


def _legacy_lie(blob: bytes) -> bytes:
    """A legacy-format blob whose storage of 4 elements says it has 2^28."""
    needle = b"cpu"
    at = blob.index(needle)
    # The storage's element count follows its location in the legacy pickle: BININT1 4 -> BININT 2^28.
    tail = blob[at + len(needle):]
    i = tail.index(b"K\x04")
    return blob[:at + len(needle)] + tail[:i] + b"J" + (1 << 28).to_bytes(4, "little") + tail[i + 2:]
