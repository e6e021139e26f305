"""What a run holds on its node, sampled as it runs: the memory, open file descriptors and child
processes of the driver, of every Ray actor on this node and of Ray's own node processes, plus
/dev/shm, the run directory and processes the sandbox left behind. The controller writes a sample
every `train.resources_every` RL steps as a `resources` record of metrics.jsonl; `coderloo.ops.soak`
decides from those records whether anything grows.

Each process is one series under a stable label (`learner-0`, `rollout-1`, `sandbox-0`,
`reward-replica-0`, `serve-controller`, `raylet`, `dashboard`, `driver`, ...): a restarted actor keeps its
label, so its series continues. Keys are flat, as a metrics line holds them:

- `rss_mb/<label>`: resident memory of the process and of its descendants that are not sampled
  on their own (a sandbox executor's fork server and supervisors count with the executor, an idle
  Ray worker with the raylet), so every process on the node that belongs to the run is counted
  once. RSS counts pages shared between forks in each of them.
- `peak_rss_mb/<label>`: the kernel's high-water mark of resident memory (VmHWM) of the process,
  plus its unsampled descendants' (a vLLM rollout worker's engine process): the peak since it
  started, however short, which a sample of `rss_mb` between steps misses (the sum of the tree's
  peaks bounds its peak together).
- `fds/<label>`: open file descriptors of the process itself.
- `children/<label>`: those descendants, counted.

Only this node is sampled (the soak runs on one machine); actors on other nodes of a cluster are
not. Actors come from Ray's actor table in the GCS (`ray._private.state.actors`): the state API
(`ray.util.state`) needs the dashboard, which a run may leave off (`dashboard: false`). On a cluster that other
runs share, their actors on this node are sampled too.
"""
from __future__ import annotations

import os
import re
import shutil
from collections import defaultdict
from pathlib import Path

import psutil
import ray

from sandbox_pool.protocol import SANDBOX_UID, TESTER_UID

MB = 2**20
# What a run appends to as it goes (its records); the rest of the run directory but checkpoints/
# should not grow.
RECORDS = ("metrics.jsonl", "samples.jsonl", "logs", "tensorboard", "wandb", "mlflow")
# An actor's label: the first pattern that matches "<class name> <actor name>"; the group, when
# there is one, is its index (learner rank, rollout worker). Actors of one label without an index
# are numbered in the order of their names.
LABELS = [
    (re.compile(r" coderloo-learner-(\d+)-"), "learner"),
    (re.compile(r" coderloo-rollout-(\d+)-"), "rollout"),
    (re.compile(r" coderloo-critic-"), "critic"),
    (re.compile(r"^SandboxExecutor "), "sandbox"),
    (re.compile(r"^ServeController "), "serve-controller"),
    (re.compile(r"^ProxyActor "), "serve-proxy"),
    (re.compile(r"^ServeReplica:"), "reward-replica"),
]
# Labels numbered even when there is one: the pool scales its executors, Serve its replicas.
ALWAYS_NUMBERED = {"sandbox", "reward-replica"}
RAY_NODE_PROCESSES = {"raylet", "gcs_server"}  # Ray's own, when this process started the local cluster
DASHBOARD_SCRIPT = "dashboard/dashboard.py"  # the dashboard's head process runs this script, when there is one


def actor_label(class_name: str, name: str) -> tuple[str, int | None]:
    """The label of an actor (without its index, when it has none of its own) and its index."""
    key = f"{class_name} {name}"
    for pattern, label in LABELS:
        match = pattern.search(key)
        if match:
            return label, int(match.group(1)) if match.groups() else None
    return re.sub(r"[^a-z0-9]+", "-", class_name.lower()).strip("-") or "actor", None


def _number_key(name: str) -> tuple:
    """Names in their numbers' order (`...-pool-10` after `...-pool-9`)."""
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name))


def directory_mb(path: Path) -> float:
    """The bytes of the files under `path` (not following links), in MB; 0 when it is not there."""
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except FileNotFoundError:
                pass  # removed while we walked (a checkpoint being replaced)
    return total / MB


def node_actors() -> dict[str, int]:
    """label -> pid of every live actor on this process's node (the labels of the module's docstring)."""
    node_id = ray.get_runtime_context().get_node_id()
    alive = [a for a in ray._private.state.actors(actor_state_name="ALIVE").values()
             if a["Address"]["NodeID"] == node_id and a["Pid"]]
    by_label: dict[str, list[tuple]] = defaultdict(list)
    for actor in alive:
        label, index = actor_label(actor["ActorClassName"], actor["Name"])
        by_label[label].append((index, _number_key(actor["Name"]), actor["StartTime"], actor["Pid"]))
    out = {}
    for label, found in by_label.items():
        own_index = all(index is not None for index, *_ in found)
        numbered = own_index or len(found) > 1 or label in ALWAYS_NUMBERED
        for position, (index, _, _, pid) in enumerate(sorted(found, key=lambda f: f[1:3])):
            out[f"{label}-{index if own_index else position}" if numbered else label] = pid
    return out


class ResourceSampler:
    """Samples the run's processes on this node and its run directory `out` (see the module's docstring)."""

    def __init__(self, out: Path):
        self.out = Path(out)

    def sample(self) -> dict[str, float]:
        table = {p.pid: p for p in psutil.process_iter(["ppid", "name", "uids", "cmdline", "memory_info"])}
        children: dict[int, list[int]] = defaultdict(list)
        for pid, p in table.items():
            children[p.info["ppid"]].append(pid)
        roots = {"driver": os.getpid(), **node_actors()}
        for pid in _descendants(os.getpid(), children, set()):  # Ray's node processes, when we started them
            if table[pid].info["name"] in RAY_NODE_PROCESSES:
                roots[table[pid].info["name"].replace("_", "-")] = pid
            elif any(arg.endswith(DASHBOARD_SCRIPT) for arg in table[pid].info["cmdline"] or ()):
                roots["dashboard"] = pid  # its head process, with the modules it starts
        root_pids = set(roots.values())
        values: dict[str, float] = {}
        for label, pid in sorted(roots.items()):
            if pid not in table:
                continue  # ended since the actor table was read
            tree = [pid, *_descendants(pid, children, root_pids)]
            values[f"rss_mb/{label}"] = sum(_rss(table[p]) for p in tree) / MB
            values[f"peak_rss_mb/{label}"] = sum(_peak_rss(p) for p in tree) / MB
            values[f"fds/{label}"] = float(_fds(table[pid]))
            values[f"children/{label}"] = float(len(tree) - 1)
        values["dev_shm_mb"] = shutil.disk_usage("/dev/shm").used / MB
        values.update(self.run_dir())
        values["sandbox_leaked_processes"] = float(sandbox_leaked(table, children))
        return values

    def run_dir(self) -> dict[str, float]:
        """The run directory: its records (append-only, they grow by design), its checkpoints (each
        is kept: they grow by one checkpoint per `checkpoint_every`), the latest checkpoint's size,
        and the rest, which should not grow."""
        records = sum(directory_mb(self.out / name) if (self.out / name).is_dir() else
                      (self.out / name).stat().st_size / MB for name in RECORDS if (self.out / name).exists())
        ckpt_root = self.out / "checkpoints"
        kept = [p for p in ckpt_root.iterdir() if p.is_dir() and not p.is_symlink()] if ckpt_root.is_dir() else []
        finished = [p for p in kept if not p.name.startswith(".")]
        latest = ckpt_root / "latest"
        latest_mb = directory_mb(ckpt_root / latest.read_text().strip()) if latest.exists() else 0.0
        checkpoints_mb = directory_mb(ckpt_root)
        return {"records_mb": float(records), "run_dir_other_mb": directory_mb(self.out) - records - checkpoints_mb,
                "checkpoints": float(len(finished)), "checkpoints_mb": checkpoints_mb,
                "checkpoint_latest_mb": latest_mb, "checkpoints_partial": float(len(kept) - len(finished))}


def _descendants(pid: int, children: dict[int, list[int]], stop: set[int]) -> list[int]:
    """Every descendant of `pid`, leaving out the subtrees of the pids in `stop`."""
    found, todo = [], list(children.get(pid, ()))
    while todo:
        child = todo.pop()
        if child in stop:
            continue
        found.append(child)
        todo.extend(children.get(child, ()))
    return found


def _rss(p: psutil.Process) -> int:
    memory = p.info["memory_info"]
    return memory.rss if memory is not None else 0  # None: a process we may not read


def _peak_rss(pid: int) -> int:
    """VmHWM of /proc/PID/status, in bytes; 0 for a process gone or not ours to read."""
    try:
        with open(f"/proc/{pid}/status") as f:
            line = next((line for line in f if line.startswith("VmHWM:")), None)
    except OSError:
        return 0
    return int(line.split()[1]) * 1024 if line else 0


def _fds(p: psutil.Process) -> int:
    try:
        return p.num_fds()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return 0


def sandbox_leaked(table: dict[int, psutil.Process], children: dict[int, list[int]]) -> int:
    """Processes of the sandbox's uids (the program's and the tester's) that no fork server holds:
    a sandboxed run's processes all descend from the supervisor its fork server forked
    (sandbox_pool/fork_server.py), and end with the run (its PID namespace, or the kill by uid), so
    one outside every fork server's tree was left behind by a run that ended. Node-wide: another
    run's leaks on this machine count too."""
    servers = [pid for pid, p in table.items() if any(arg.endswith("fork_server.py") for arg in p.info["cmdline"] or ())]
    held = {d for pid in servers for d in _descendants(pid, children, set())}
    return sum(1 for pid, p in table.items()
               if p.info["uids"] is not None and p.info["uids"].real in (SANDBOX_UID, TESTER_UID) and pid not in held)
