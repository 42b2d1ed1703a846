"""farm_client: what a trainer installs to consume a farm. Imports protos only, never farmd."""

from farm_client.client import Batch, FarmClient, advantages

__all__ = ["Batch", "FarmClient", "advantages"]
