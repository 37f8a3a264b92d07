"""A worker process: a gRPC server that runs tasks and publishes itself.

``python -m workers --namespace NS`` runs one (see :mod:`workers.process`).
:mod:`workers.tasks` is the task format both sides share; :mod:`workers.auth`
the pool's token.
"""
