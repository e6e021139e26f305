"""Process-wide runtime set-up: environment defaults and the local Ray cluster."""
from __future__ import annotations

import os
import socket
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent

# Defaults for one CPU machine; a cluster's environment overrides them.
ENV_DEFAULTS = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "RAY_AUTH_MODE": "disabled",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "DS_ACCELERATOR": "cpu",
    "TORCH_EXTENSIONS_DIR": str(REPO_ROOT / ".cache" / "torch_extensions"),
    "TOKENIZERS_PARALLELISM": "false",
    # vLLM logs several lines per weight update; errors still show.
    "VLLM_LOGGING_LEVEL": "ERROR",
}


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


def apply_env_defaults() -> None:
    for key, value in ENV_DEFAULTS.items():
        os.environ.setdefault(key, value)


# The custom resource sandbox executors ask for (sandbox_pool.pool); a cluster's CPU nodes offer it.
LOCAL_SANDBOX_SLOTS = 64


def init_ray(num_cpus: int | None = None, address: str | None = None) -> None:
    """Start (or join, when `address` is given) a Ray cluster; a local one stays on 127.0.0.1 and
    offers the `sandbox` resource for the sandbox pool's executors."""
    import ray

    apply_env_defaults()
    if ray.is_initialized():
        return
    env_vars = {k: os.environ[k] for k in ENV_DEFAULTS}
    if address:
        ray.init(address=address, runtime_env={"env_vars": env_vars})
        return
    ray.init(
        address="local",
        num_cpus=num_cpus,
        resources={"sandbox": LOCAL_SANDBOX_SLOTS},
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
        runtime_env={"env_vars": env_vars},
        log_to_driver=True,
    )
