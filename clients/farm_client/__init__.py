"""farm_client: what a trainer installs to consume a farm. Imports protos only, never farmd.

``FarmDataset``, ``TensorBatch``, ``collate`` and ``token_logprobs`` live in ``farm_client.tensors``, the
one module that needs torch; they are importable from here too, and importing them is what loads torch.
"""

from typing import TYPE_CHECKING, Any

from farm_client.client import Batch, FarmClient, Listing, VerdictChange, Withdrawal, advantages
from farm_client.sequences import UntokenizedError, group_advantages, token_rows
from farm_client.verify import SampledTask, Verdict

if TYPE_CHECKING:
    from farm_client.tensors import FarmDataset, TensorBatch, collate, token_logprobs

_TORCH_NAMES = frozenset({"FarmDataset", "TensorBatch", "collate", "token_logprobs"})

__all__ = ["Batch", "FarmClient", "FarmDataset", "Listing", "SampledTask", "TensorBatch", "UntokenizedError", "Verdict",
           "VerdictChange", "Withdrawal", "advantages", "collate", "group_advantages", "token_logprobs", "token_rows"]


def __getattr__(name: str) -> Any:
    # Lazily, so a client without torch (a coordinator script, an evaluation job) never needs it.
    if name in _TORCH_NAMES:
        from farm_client import tensors

        return getattr(tensors, name)
    raise AttributeError(f"module 'farm_client' has no attribute {name!r}")
