"""A worker process: a gRPC server that runs tasks and publishes itself.

``python -m workers --namespace NS`` runs one (see :mod:`workers.process`).
:mod:`workers.protocol` is what the dispatcher and clients speak to a
worker: the task codec, functions shipped by value, the token, the outbox.
:mod:`workers.common` is what every kind of pool process does the same way.
"""

import os

# gRPC's fork handlers crash children forked while its threads run (seen
# here as a SIGSEGV in a worker started from a process with a live client);
# pool processes are forked from the zygote, never from this one. Must
# precede any grpc import: every module that imports grpc is under this
# package or under ``pool``, whose ``__init__`` imports this one first. (The
# zygote's preload sets it whatever the environment says.)
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "0")
