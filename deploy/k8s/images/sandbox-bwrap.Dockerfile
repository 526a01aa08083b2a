# The Temper image plus bubblewrap, for the sandbox service's bwrap backend in a pod
# (deploy/k8s/base/services/sandbox.yaml), and gcc for the `c` language.
# Build from the repository root, after the Temper image:
#   docker build -t temper:latest -f deploy/temper/Dockerfile .
#   docker build -t temper-sandbox-bwrap:latest -f deploy/k8s/images/sandbox-bwrap.Dockerfile .
ARG BASE=temper:latest
FROM ${BASE}

USER root
RUN apt-get update \
    && apt-get install -y --no-install-recommends bubblewrap gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
USER temper
