# One image for every service of docker-compose.yml: the dispatcher
# (`pool up`) and the workers (`python -m workers`).
FROM python:3.11-slim

WORKDIR /app
COPY pyproject.toml README.md ./
COPY discovery discovery
COPY workers workers
COPY pool pool
RUN pip install --no-cache-dir '.[redis,dashboard]'

# Task modules: mount yours here (or build an image FROM this one with them);
# workers import from their working directory.
WORKDIR /tasks
# The pool's private files (token, dispatcher address, sockets).
ENV XDG_RUNTIME_DIR=/run/pool
RUN mkdir -m 0700 /run/pool
