"""Process-wide runtime set-up: environment defaults and the local Ray cluster."""
from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def resolve(path: str | Path) -> Path:
    """A path of the config or the command line: ~ is the home directory, a relative path is from
    the repository root."""
    p = Path(path).expanduser()
    return p if p.is_absolute() else REPO_ROOT / p
# What is derived from shared inputs and costs minutes to compute, kept for every checkout of the user.
USER_CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "coderloo"

# Defaults for one CPU machine; a cluster's environment overrides them.
ENV_DEFAULTS = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "RAY_AUTH_MODE": "disabled",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "DS_ACCELERATOR": "cpu",
    "TOKENIZERS_PARALLELISM": "false",
    # vLLM logs several lines per weight update; errors still show.
    "VLLM_LOGGING_LEVEL": "ERROR",
}


def apply_env_defaults() -> None:
    for key, value in ENV_DEFAULTS.items():
        os.environ.setdefault(key, value)


# The custom resource sandbox executors ask for (sandbox_pool.pool); a cluster's CPU nodes offer it.
LOCAL_SANDBOX_SLOTS = 64


# Ray takes a node's address from the default route unless told this: with it, every server of a
# local cluster (GCS, raylet, the metrics endpoint) listens on 127.0.0.1 only.
LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}


def init_ray(num_cpus: int | None = None, address: str | None = None, metrics_export_port: int | None = None,
             dashboard: bool = False) -> None:
    """Start (or join, when `address` is given) a Ray cluster; a local one stays on 127.0.0.1,
    offers the `sandbox` resource for the sandbox pool's executors, serves Ray's Prometheus
    endpoint on `metrics_export_port` (None: a free port Ray picks; see `metrics_endpoint`) and,
    with `dashboard`, Ray's dashboard (`dashboard_url`)."""
    import ray

    apply_env_defaults()
    if ray.is_initialized():
        return
    env_vars = {k: os.environ[k] for k in ENV_DEFAULTS}
    if address:
        ray.init(address=address, runtime_env={"env_vars": env_vars})
        return
    os.environ.update(LOOPBACK_ENV)  # for the processes Ray starts
    # This process read the variable when it imported Ray, possibly before it was set (a test
    # suite, a benchmark); without it Ray takes the default route's address for the node.
    from ray._private import ray_constants

    ray_constants.ENABLE_RAY_CLUSTER = False
    ray.init(
        address="local",
        num_cpus=num_cpus,
        resources={"sandbox": LOCAL_SANDBOX_SLOTS},
        include_dashboard=dashboard,
        dashboard_host="127.0.0.1",
        _node_ip_address="127.0.0.1",
        _metrics_export_port=metrics_export_port,
        # Metrics reach the endpoint every 2 s rather than 10 s: a short run shows on it. The GCS
        # keeps the events of the last 10,000 tasks (with Ray's default, 100,000, its memory grew
        # step after step in the soak: bench/results.md, "soak"); the dashboard's task views show
        # those.
        _system_config={"metrics_report_interval_ms": 2000, "task_events_max_num_task_in_gcs": 10_000},
        runtime_env={"env_vars": env_vars},
        log_to_driver=True,
    )


def dashboard_url() -> str | None:
    """The URL of the Ray dashboard of the cluster this process is connected to; None without one."""
    import ray

    url = ray._private.worker.global_worker.node.address_info.get("webui_url")
    return f"http://{url}" if url else None


def metrics_endpoint() -> str:
    """The URL of Ray's Prometheus endpoint on this process's node (custom metrics: coderloo.metrics)."""
    import ray

    node_id = ray.get_runtime_context().get_node_id()
    node = next(n for n in ray.nodes() if n["NodeID"] == node_id)
    return f"http://{node['NodeManagerAddress']}:{node['MetricsExportPort']}/metrics"
