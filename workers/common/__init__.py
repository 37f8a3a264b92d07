"""What every kind of pool process does the same way: the worker, the
dispatcher, the supervisor and a client.

- :mod:`~workers.common.spec`: how a setting is declared once, and the
  command line built from it; :mod:`~workers.common.options`: the settings
  more than one process takes.
- :mod:`~workers.common.serving`: bind, say READY, wait to stop.
- :mod:`~workers.common.channels`: a channel to a pool process.
- :mod:`~workers.common.offload`: blocking calls on threads their owner ends.
- :mod:`~workers.common.pipes`: lines over the pipes between processes.

The rule: a module used by more than one kind of process lives here, not
in the room of one of them. It imports only :mod:`discovery`,
:mod:`workers.protocol` and this package, never the worker's own modules
or :mod:`pool`. (It sits under ``workers`` because dependencies point
``pool`` -> ``workers`` -> ``discovery``: both rooms above it can import
it.)
"""
