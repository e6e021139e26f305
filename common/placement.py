"""Ray placement options and the addresses where peers reach a process."""
from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on `host` now (for a rendezvous or an HTTP proxy started next)."""
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
