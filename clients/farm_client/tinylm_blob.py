"""A tiny LM policy's bytes, read without torch: every size they declare is held to the bytes they hold
before anything is allocated.

A policy blob is what ``torch.save`` writes: a zip archive holding a pickle (``<top>/data.pkl``) that
names each tensor's storage (``<top>/data/<key>``), its element count, shape and strides. torch itself
makes what a blob declares: a config of 48 layers of width 2048 is a model of gigabytes whatever the
blob weighs, and a storage kept deflated in the zip inflates to whatever its header says (a 195 KB blob
made torch allocate 200 MB here). So before torch sees a blob, ``read_layout`` checks it as data:

- the archive: at most ``MAX_MEMBERS`` members, each stored (never compressed), its stated size its real
  size, inside the blob; so nothing torch reads from it is larger than the blob;
- the pickle: read by an unpickler that makes no object of any class but the few a policy needs
  (tensors become descriptions, storages references, nothing is called) and at most ``MAX_PICKLE_BYTES``;
- the policy: ``format`` is ``FORMAT``, the config in bounds, and the state exactly the tensors that
  config's model has (``expected_shapes``, pure arithmetic), each contiguous, of a floating dtype, alone
  on its own storage whose record holds exactly its bytes; at most ``MAX_PARAMETERS`` parameters.

What passes allocates, in torch, its own storages (no more bytes than the blob) and a model of the
same shapes. ``PolicyFormatError.claimed`` says whether the blob said it was a tiny LM policy at all:
content that does not is some other kind of policy, which farmd stores and never loads.
"""

from __future__ import annotations

import io
import pickle
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Any

FORMAT = "farm-tinylm/1"
"""What a policy blob says it is; anything else is refused."""

SPECIALS = 3
"""pad, bos and eos: the tokens before the vocabulary's characters."""

# A blob comes from a trainer: bounded before a tensor of it is made.
MAX_VOCAB_CHARS = 256
MAX_D_MODEL = 2048
MAX_LAYERS = 48
MAX_HEADS = 64
MAX_LEN = 8192
MAX_PARAMETERS = 1 << 28
"""About a gigabyte of float32 weights: what ``MAX_POLICY_READ_BYTES`` lets a worker read anyway."""
MAX_MEMBERS = 4096
"""Records in the archive: a policy of ``MAX_LAYERS`` layers has 16 per layer and a few more."""
MAX_PICKLE_BYTES = 4 << 20
"""The pickle that describes the tensors (a few kilobytes for any model within the bounds above)."""

CONFIG_FIELDS = ("vocab", "d_model", "n_layers", "n_heads", "max_len")

_FLOAT_STORAGES = {"FloatStorage": 4, "HalfStorage": 2, "BFloat16Storage": 2, "DoubleStorage": 8}
"""The storage types a policy's weights may have, and their element sizes."""


class PolicyFormatError(ValueError):
    """A blob that is not a tiny LM policy this module can load (wrong format, sizes out of bounds).

    ``claimed``: the blob said it was one (its ``format`` is ``FORMAT``), so it is a broken one."""

    def __init__(self, message: str, *, claimed: bool = False) -> None:
        super().__init__(message)
        self.claimed = claimed


def check_config(config: dict[str, Any]) -> None:
    """``PolicyFormatError`` for a config whose sizes are out of bounds (what ``LMConfig`` checks)."""
    vocab = config.get("vocab")
    if not isinstance(vocab, str) or not 0 < len(vocab) <= MAX_VOCAB_CHARS or len(set(vocab)) != len(vocab):
        raise PolicyFormatError(f"vocab must be 1..{MAX_VOCAB_CHARS} distinct characters")
    for name, top in (("d_model", MAX_D_MODEL), ("n_layers", MAX_LAYERS), ("n_heads", MAX_HEADS), ("max_len", MAX_LEN)):
        value = config.get(name)
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= top:
            raise PolicyFormatError(f"{name} must be an integer in 1..{top}, got {value!r}"[:200])
    if config["d_model"] % config["n_heads"]:
        raise PolicyFormatError(f"d_model ({config['d_model']}) must be a multiple of n_heads ({config['n_heads']})")


def expected_shapes(config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Every weight of the model ``config`` describes, by its state-dict name: what ``TinyLM`` holds."""
    d, v, t = config["d_model"], SPECIALS + len(config["vocab"]), config["max_len"]
    shapes: dict[str, tuple[int, ...]] = {"embed.weight": (v, d), "pos.weight": (t, d)}
    for i in range(config["n_layers"]):
        block = f"blocks.{i}."
        shapes.update({
            f"{block}ln1.weight": (d,), f"{block}ln1.bias": (d,),
            f"{block}qkv.weight": (3 * d, d), f"{block}qkv.bias": (3 * d,),
            f"{block}out.weight": (d, d), f"{block}out.bias": (d,),
            f"{block}ln2.weight": (d,), f"{block}ln2.bias": (d,),
            f"{block}mlp.0.weight": (4 * d, d), f"{block}mlp.0.bias": (4 * d,),
            f"{block}mlp.2.weight": (d, 4 * d), f"{block}mlp.2.bias": (d,),
        })
    shapes["ln.weight"] = (d,)
    shapes["ln.bias"] = (d,)
    return shapes


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


@dataclass(frozen=True, slots=True)
class Layout:
    """What a blob that passed holds: its config, and each weight's shape and element size."""

    config: dict[str, Any]
    shapes: dict[str, tuple[int, ...]]
    element_bytes: dict[str, int]
    parameters: int


# -- the restricted unpickler -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _StorageType:
    name: str
    element_bytes: int


@dataclass(frozen=True, slots=True)
class _Storage:
    kind: _StorageType
    key: str
    numel: int


@dataclass(frozen=True, slots=True)
class _Tensor:
    storage: _Storage
    offset: int
    size: tuple[int, ...]
    stride: tuple[int, ...]


def _rebuild_tensor(storage: Any, offset: Any, size: Any, stride: Any, *_rest: Any) -> _Tensor:
    """Stands for ``torch._utils._rebuild_tensor_v2``: describes the tensor, makes nothing."""
    if not isinstance(storage, _Storage):
        raise PolicyFormatError("a tensor that is not backed by a storage record")
    if not (_ints(size) and _ints(stride) and len(size) == len(stride) <= 8 and _int(offset)):
        raise PolicyFormatError("a tensor whose size, strides or offset are not small lists of integers")
    return _Tensor(storage, offset, tuple(size), tuple(stride))


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 62


def _ints(value: Any) -> bool:
    return isinstance(value, tuple) and all(_int(v) for v in value)


_GLOBALS: dict[tuple[str, str], Callable[..., Any] | _StorageType] = {
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor,
    ("collections", "OrderedDict"): dict,
    **{("torch", name): _StorageType(name, size) for name, size in _FLOAT_STORAGES.items()},
}


class _Unpickler(pickle.Unpickler):
    """Plain values, and the few names a policy's pickle uses, as stand-ins; anything else is refused."""

    def find_class(self, module: str, name: str) -> Any:
        found = _GLOBALS.get((module, name))
        if found is None:
            raise PolicyFormatError(f"the blob's pickle names {module[:60]}.{name[:60]}, which a policy does not use")
        return found

    def persistent_load(self, pid: Any) -> _Storage:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage" and isinstance(pid[1], _StorageType)
                and isinstance(pid[2], str) and len(pid[2]) <= 32 and pid[3] == "cpu" and _int(pid[4])):
            raise PolicyFormatError("a storage reference that is not a CPU storage of a floating dtype")
        return _Storage(pid[1], pid[2], pid[4])


# -- reading ------------------------------------------------------------------------------------


def read_layout(blob: bytes | IO[bytes]) -> Layout:
    """The layout of the tiny LM policy ``blob`` (its bytes, or a seekable file of them), checked as the
    module says; ``PolicyFormatError`` for anything else. Reads the archive's directory and its pickle only."""
    source = io.BytesIO(blob) if isinstance(blob, bytes | bytearray) else blob
    size = source.seek(0, io.SEEK_END)
    source.seek(0)
    head = source.read(MAX_PICKLE_BYTES)
    if not head.startswith(b"PK\x03\x04"):  # torch's legacy format sizes its storages before reading them
        raise PolicyFormatError("not a zip archive as torch.save writes one", claimed=FORMAT.encode() in head)
    del head
    source.seek(0)
    try:
        with zipfile.ZipFile(source) as archive:
            infos = archive.infolist()
            if len(infos) > MAX_MEMBERS:
                raise PolicyFormatError(f"the archive has {len(infos)} members; a policy has at most {MAX_MEMBERS}")
            pickles = [i for i in infos if i.filename.endswith("/data.pkl") and i.filename.count("/") == 1]
            if len(pickles) != 1:
                raise PolicyFormatError("not an archive torch.save wrote: no single <top>/data.pkl")
            with archive.open(pickles[0]) as member:  # at most the bound, however it is stored
                raw = member.read(MAX_PICKLE_BYTES + 1)
    except (zipfile.BadZipFile, OSError, ValueError, EOFError, RuntimeError) as exc:
        raise PolicyFormatError(f"not a readable zip archive: {exc}"[:300]) from None
    claimed = FORMAT.encode() in raw
    try:
        if len(raw) > MAX_PICKLE_BYTES:
            raise PolicyFormatError(f"the blob's pickle is over {MAX_PICKLE_BYTES} bytes, more than a policy's")
        records = _records(infos, size)
        data = _unpickle(raw)
        claimed = claimed or (isinstance(data, dict) and data.get("format") == FORMAT)
        return _layout(data, records, pickles[0].filename.removesuffix("data.pkl"))
    except PolicyFormatError as exc:
        raise PolicyFormatError(str(exc), claimed=claimed) from None


def _records(infos: list[zipfile.ZipInfo], size: int) -> dict[str, int]:
    """Every member's name and real size: stored, as large as it says, inside the blob."""
    records: dict[str, int] = {}
    total = 0
    for info in infos:
        name = info.filename[:200]
        if info.compress_type != zipfile.ZIP_STORED or info.compress_size != info.file_size:
            raise PolicyFormatError(f"member {name!r} is compressed: torch.save stores every member as it is")
        if info.header_offset + info.file_size > size or info.filename in records:
            raise PolicyFormatError(f"member {name!r} says it holds more than the blob does")
        total += info.file_size
        records[info.filename] = info.file_size
    if total > size:
        raise PolicyFormatError(f"the archive's members say they hold {total} bytes; the blob has {size}")
    return records


def _unpickle(raw: bytes) -> Any:
    try:
        return _Unpickler(io.BytesIO(raw)).load()
    except PolicyFormatError:
        raise
    except Exception as exc:  # a truncated or malformed pickle, a type error in a stand-in, ...
        raise PolicyFormatError(f"the blob's pickle cannot be read as a policy: {type(exc).__name__}: {exc}"[:300]
                                ) from None


def _layout(data: Any, records: dict[str, int], top: str) -> Layout:
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        got = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise PolicyFormatError(f"the blob's format is {str(got)[:60]!r}, not {FORMAT!r}")
    config = data.get("config")
    if not isinstance(config, dict) or set(config) != set(CONFIG_FIELDS):
        raise PolicyFormatError(f"the blob's config must have exactly {sorted(CONFIG_FIELDS)}")
    check_config(config)
    shapes = expected_shapes(config)
    parameters = sum(_numel(s) for s in shapes.values())
    if parameters > MAX_PARAMETERS:
        raise PolicyFormatError(f"the config describes {parameters} parameters; a policy has at most {MAX_PARAMETERS}")
    state = data.get("state")
    if not isinstance(state, dict) or not all(isinstance(v, _Tensor) for v in state.values()):
        raise PolicyFormatError("the blob's state must map names to tensors")
    if set(state) != set(shapes):
        missing = sorted(set(shapes) - set(state))[:3]
        extra = sorted(str(k)[:60] for k in set(state) - set(shapes))[:3]
        raise PolicyFormatError(f"the weights do not fit the config: missing {missing}, unexpected {extra}")
    seen: set[str] = set()
    element_bytes: dict[str, int] = {}
    for name, tensor in state.items():
        want = shapes[name]
        if tensor.size != want:
            raise PolicyFormatError(f"weight {name!r} is {list(tensor.size)}; the config makes it {list(want)}")
        numel = _numel(want)
        storage = tensor.storage
        if tensor.stride != _contiguous(want) or tensor.offset != 0 or storage.numel != numel:
            raise PolicyFormatError(f"weight {name!r} is not a contiguous tensor with a storage of its own size")
        if storage.key in seen:
            raise PolicyFormatError(f"weight {name!r} shares its storage with another weight")
        seen.add(storage.key)
        record = records.get(f"{top}data/{storage.key}")
        if record != numel * storage.kind.element_bytes:
            raise PolicyFormatError(f"weight {name!r} declares {numel * storage.kind.element_bytes} bytes; its record "
                                    f"holds {record}")
        element_bytes[name] = storage.kind.element_bytes
    return Layout(config=dict(config), shapes=shapes, element_bytes=element_bytes, parameters=parameters)


def _contiguous(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 1
    for s in reversed(shape):
        strides.append(step)
        step *= s
    return tuple(reversed(strides))
