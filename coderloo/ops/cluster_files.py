"""Checks of a cluster file before `ray up`: Ray's cluster schema, and that a training config's
actors fit its node types (the custom resources they ask for are offered, the GPUs suffice).

    python -m coderloo.ops.cluster_files cluster.yaml --config configs/qwen2.5-coder-7b.yaml
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import yaml

from sandbox_pool.pool import RESOURCE as SANDBOX_RESOURCE


class ClusterFileError(ValueError):
    """A cluster file Ray would refuse, or one a config's actors do not fit."""


def validate_cluster_file(path: str | Path) -> dict:
    """The file's config with Ray's defaults filled in, as `ray up` would use it; a file that does
    not match Ray's schema raises ClusterFileError naming the file and the field.

    The fake multi-node provider reads its file as it is (Ray ships no defaults for it), so such a
    file is checked without defaults."""
    import jsonschema
    from ray.autoscaler._private.util import prepare_config, validate_config

    path = Path(path)
    try:
        config = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise ClusterFileError(f"{path}: not YAML: {e}") from None
    if not isinstance(config, dict) or "provider" not in config:
        raise ClusterFileError(f"{path}: a cluster file is a mapping with a `provider` section")
    try:
        if config["provider"].get("type") != "fake_multinode":
            config = prepare_config(config)
        validate_config(config)
    except jsonschema.ValidationError as e:
        where = "/".join(str(p) for p in e.absolute_path) or "(top level)"
        raise ClusterFileError(f"{path}: {where}: {e.message}") from None
    except (ValueError, RuntimeError) as e:
        raise ClusterFileError(f"{path}: {e}") from None
    return config


def _offering(cluster: dict, resource: str) -> list[tuple[str, dict]]:
    return [(name, t) for name, t in cluster["available_node_types"].items() if t["resources"].get(resource, 0) > 0]


def placement_problems(cluster: dict, config) -> list[str]:
    """What keeps `config`'s (coderloo.config.Config) actors from being placed on `cluster` at
    its largest: each problem names the config field and the node types."""
    problems = []

    def most(resource: str, types: list[tuple[str, dict]]) -> float:
        """Units of `resource` on `types` with each at its max_workers (the head: once)."""
        return sum(t["resources"].get(resource, 0) * (1 if name == cluster["head_node_type"] else t.get("max_workers", 0))
                   for name, t in types)

    actors = [
        ("rollout", config.rollout.num_workers, config.rollout.resources, config.rollout.gpus_per_worker),
        ("learner", config.learner.num_ranks, config.learner.resources, 1.0 if config.learner.device == "cuda" else 0.0),
    ]
    for section, count, resources, gpus in actors:
        hosts = list(cluster["available_node_types"].items())
        for resource, amount in resources.items():
            offering = _offering(cluster, resource)
            if not offering:
                problems.append(f"{section}.resources asks for `{resource}`, which no node type offers")
                continue
            hosts = [h for h in hosts if h in offering]
            if most(resource, offering) < amount * count:
                problems.append(f"{section}: {count} x {amount:g} `{resource}` needed, the node types offering it "
                                f"({', '.join(n for n, _ in offering)}) have {most(resource, offering):g} at most")
        if gpus and most("GPU", hosts) < gpus * count:
            problems.append(f"{section}: {count} x {gpus:g} GPUs needed on {', '.join(n for n, _ in hosts)}, "
                            f"which have {most('GPU', hosts):g} at most")
    if not _offering(cluster, SANDBOX_RESOURCE):
        problems.append(f"no node type offers `{SANDBOX_RESOURCE}`: the sandbox executors would never be placed")
    return problems


def local_placement_problems(config, resources: dict[str, float]) -> list[str]:
    """`placement_problems` on a local cluster of one node offering `resources` (what
    coderloo.runtime.init_ray starts on this machine, or what the cluster this process is on
    offers), and the reward service's first replicas' CPUs: what would wait forever there."""
    cluster = {"head_node_type": "local", "available_node_types": {"local": {"resources": resources, "max_workers": 0}}}
    problems = placement_problems(cluster, config)
    service = config.reward
    cpus = service.autoscaling.min_replicas * service.replica_cpus
    if cpus > resources.get("CPU", 0):
        problems.append(f"reward: {service.autoscaling.min_replicas} replicas x {service.replica_cpus:g} CPUs "
                        f"(reward.autoscaling.min_replicas x reward.replica_cpus) needed, the local cluster has "
                        f"{resources.get('CPU', 0):g}")
    return [f"{p} (local cluster: {', '.join(f'{v:g} {k}' for k, v in sorted(resources.items()) if k in ('CPU', 'GPU', SANDBOX_RESOURCE))})"
            for p in problems]


def cpu_set_problems(config, available: set[int] | None = None) -> list[str]:
    """Each role's CPU set (common/cpus.py) that names a CPU this machine lacks (by default: the
    CPUs this process may run on). A cluster's actors check theirs on their nodes as they start."""
    from common.cpus import cpu_set_problem

    sets = {"rollout.cpus": config.rollout.cpus, "learner.cpus": config.learner.cpus, "reward.cpus": config.reward.cpus,
            "reward.pool.cpus": config.reward.pool.cpus, "train.driver_cpus": config.train.driver_cpus}
    return [p for field, cpus in sets.items() if (p := cpu_set_problem(cpus, field, available))]


def check_local_resources(config) -> None:
    """A local cluster's actors fit this machine (or the local cluster this process already
    runs), before anything is written: else they would wait forever for a GPU or a resource no
    node offers. A cluster's node types are checked against the config by `make cluster-check`."""
    import ray
    import torch

    from coderloo.config import ConfigError
    from coderloo.runtime import LOCAL_SANDBOX_SLOTS

    if config.ray_address:
        return
    if ray.is_initialized():
        resources = ray.cluster_resources()
    else:
        resources = {"CPU": float(os.cpu_count() or 1), "GPU": float(torch.cuda.device_count()), SANDBOX_RESOURCE: LOCAL_SANDBOX_SLOTS}
    problems = local_placement_problems(config, resources) + cpu_set_problems(config)
    if problems:
        raise ConfigError("this config's actors do not fit the local Ray cluster:\n  " + "\n  ".join(problems))


def main(argv: list[str] | None = None) -> int:
    from coderloo.config import ConfigError, load_config

    parser = argparse.ArgumentParser(prog="python -m coderloo.ops.cluster_files", description=__doc__.split("\n\n")[0])
    parser.add_argument("cluster_file")
    parser.add_argument("--config", help="a training config whose actors must fit the cluster")
    args = parser.parse_args(argv)
    try:
        cluster = validate_cluster_file(args.cluster_file)
        problems = placement_problems(cluster, load_config(args.config)) if args.config else []
    except (ClusterFileError, ConfigError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for problem in problems:
        print(f"error: {args.cluster_file} with {args.config}: {problem}", file=sys.stderr)
    if not problems:
        print(f"{args.cluster_file}: valid" + (f"; {args.config}'s actors fit" if args.config else ""))
    return 2 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
