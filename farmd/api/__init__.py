"""gRPC servicers: thin translation between protos and farm's services. Protos stop here."""
