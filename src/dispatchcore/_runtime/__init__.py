"""The rank side every executor shares: ``WorkerHost``, rank threads, isolation copies, the call handle
that owns every time bound."""
