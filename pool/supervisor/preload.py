"""What the zygote's fork server (:func:`pool.supervisor.forker.serve`)
imports, before it forks anything; nothing else imports it.

gRPC must not install fork handlers in a process that forks pool processes:
they crash a child forked while gRPC's threads run, and the zygote never
runs them anyway. So this turns them off before grpc is imported, whatever
the environment says. It then imports everything a worker and the
dispatcher need, so that each forked child starts with it in memory,
shared with its siblings, and freezes those objects out of the garbage
collector's reach: a collection in a child would otherwise write to every
page it visits and so copy it.
"""

import contextlib
import os
import sys

# A session of its own, as every other pool process has: a signal sent to
# the supervisor's process group (a terminal's, `timeout`'s, a service
# manager's) is for the supervisor, which stops the pool in order.
with contextlib.suppress(OSError):
    os.setsid()

# portalocker imports its optional Redis lock whenever redis-py is installed
# (the `redis` extra): 25 ms and about a megabyte in every pool process, for
# a lock none of them uses. (A process on Redis discovery imports redis-py
# itself, and portalocker's lock stays a stub that says it is missing.)
sys.modules.setdefault("portalocker.redis", None)  # type: ignore[arg-type]

os.environ["GRPC_ENABLE_FORK_SUPPORT"] = "0"
# gRPC's INFO lines (a GOAWAY from each worker that stops) are not for users.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

import gc

import google.protobuf
import grpc
import uvloop

import pool.dispatcher.server
import workers.process

gc.freeze()

__all__ = ["google", "grpc", "pool", "uvloop", "workers"]
