"""The web console (``farmd serve --http HOST:PORT``): farm's services as a page, for people who would
rather look than read. ``server`` serves the page and its calls; ``gateway`` makes each call on the same
servicers, under the same credentials and roles, as the gRPC API."""

from farmd.api.console.gateway import Gateway
from farmd.api.console.server import ConsoleServer

__all__ = ["ConsoleServer", "Gateway"]
