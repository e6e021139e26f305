"""Ray placement options and the addresses where peers reach a process."""
from __future__ import annotations

import random
import socket


# Ports handed out here lie above Ray's worker ports (10002-19999) and below the kernel's ephemeral
# range: a port from bind(0) is an ephemeral one, which any process's outgoing connection can take
# as its source port before our server binds it (seen: Serve's proxy failing to bind, every HTTP
# test after it failing).
PORTS_FROM = 20_000


def _ephemeral_start() -> int:
    try:
        return int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on `host` now (for a rendezvous or an HTTP proxy started next), outside the
    kernel's ephemeral range when it leaves room for one."""
    end = _ephemeral_start()
    for _ in range(100 if end > PORTS_FROM else 0):
        port = random.randrange(PORTS_FROM, end)
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def node_address_and_port() -> tuple[str, int]:
    """This Ray node's address and a port free on it: where peers on other nodes reach a store
    this process hosts (a torch.distributed rendezvous, a weight-sync group)."""
    import ray

    host = ray.util.get_node_ip_address()
    return host, free_port(host)


def placement_options(gpus: float, resources: dict[str, float]) -> dict:
    """Ray actor options for `gpus` and custom `resources`, only those asked for: an actor given
    any resource option also holds a CPU while it runs (Ray's default otherwise holds none), and
    on a 2-core machine the learner, a rollout worker and a reward replica would not all start."""
    options: dict = {}
    if gpus:
        options["num_gpus"] = gpus
    if resources:
        options["resources"] = resources
    return options
