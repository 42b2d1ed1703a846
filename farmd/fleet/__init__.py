"""A worker node's side of the fleet (``farmd serve --join``): the link to the coordinator, the leases
it takes over that link, the results it buffers on disk until the coordinator has them, and the
policies it caches by content hash. The coordinator's side is ``farmd.scheduler.nodes`` and
``farmd.api.node_service``."""
