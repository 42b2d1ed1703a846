"""Entry points: ``farmd`` (the daemon) and ``farmctl`` (the operator's tool).

Remote commands go through gRPC like any client; local ones (``sandbox run``,
``doctor``) call farmd's services in process.
"""
