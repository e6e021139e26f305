#!/usr/bin/env bash
# What the whole suite needs besides the virtualenv, set up by `make test` itself: Debian's
# Docker engine (the Docker sandbox is tested for real), debootstrap (the sandbox image's base
# without a registry), Chromium (tests/test_report.py opens a report in it) and Node.js (the
# process sandbox runs JavaScript with the machine's node). Installs what is missing as root,
# otherwise names it and stops; starts the engine when none answers; builds the sandbox image.
set -euo pipefail
cd "$(dirname "$0")/.."
missing=()
for pair in dockerd:docker.io debootstrap:debootstrap chromium:chromium node:nodejs; do
    command -v "${pair%%:*}" >/dev/null || missing+=("${pair#*:}")
done
if ((${#missing[@]})); then
    if [[ $(id -u) != 0 ]]; then
        echo "make test needs these Debian packages: ${missing[*]} (apt-get install ${missing[*]}, as root)" >&2
        exit 1
    fi
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}"
fi
if ! docker info >/dev/null 2>&1; then
    if [[ $(id -u) != 0 ]]; then
        echo "make test needs a running Docker engine (dockerd --iptables=false --bridge=none, as root)" >&2
        exit 1
    fi
    mkdir -p .cache
    nohup dockerd --iptables=false --bridge=none >.cache/dockerd.log 2>&1 &
    for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 0.5; done
    docker info >/dev/null 2>&1 || { echo "dockerd did not start:" >&2; tail -20 .cache/dockerd.log >&2; exit 1; }
fi
.venv/bin/python -m sandbox_pool.image build
