"""A Ray cluster of several nodes on this one machine: Ray's fake multi-node provider reads
cluster-local.yaml and starts each node the autoscaler asks for as local Ray processes, so
autoscaling works here as on a cloud cluster.

    python -m coderloo.ops.local_cluster up      # head on 127.0.0.1:6379, dashboard on :8265
    python -m coderloo.ops.local_cluster down    # this cluster's processes only

`down` stops only the processes of the cluster `up` started (found by its own temp directory),
not other Ray instances on the machine, as `ray stop` would.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import yaml

from coderloo.runtime import ENV_DEFAULTS, LOOPBACK_ENV, REPO_ROOT

CLUSTER_FILE = REPO_ROOT / "cluster-local.yaml"
STATE_FILE = REPO_ROOT / ".cache" / "local-cluster.json"

@dataclass
class LocalCluster:
    gcs_address: str  # what ray.init(address=...) takes
    dashboard_url: str  # what `ray job submit --address` takes
    temp_dir: str

    def stop(self) -> None:
        """Terminate every process of this cluster (its head's and its nodes') and their children;
        remove its temp directory (its logs with it)."""
        import psutil

        def each(procs, action) -> list:
            """`action(process)` for every process; those already gone are skipped."""
            out = []
            for p in procs:
                with contextlib.suppress(psutil.NoSuchProcess):
                    out.append(action(p))
            return out

        top = [p for p in psutil.process_iter(["cmdline"]) if any(self.temp_dir in a for a in p.info["cmdline"] or [])]
        procs = set(top).union(*each(top, lambda p: p.children(recursive=True)))
        each(procs, psutil.Process.terminate)
        _, alive = psutil.wait_procs(procs, timeout=10)
        each(alive, psutil.Process.kill)
        psutil.wait_procs(alive, timeout=10)
        shutil.rmtree(self.temp_dir, ignore_errors=True)


def start(port: int = 6379, dashboard_port: int = 8265, head_cpus: int = 4, config: Path = CLUSTER_FILE,
          update_interval_s: int = 5) -> LocalCluster:
    """Start the head with the autoscaler on `config`; worker nodes come when work asks for them."""
    cluster = yaml.safe_load(config.read_text())
    cluster["provider"]["gcs_address"] = f"127.0.0.1:{port}"  # where the fake nodes join
    # Unix socket paths under it must stay short (at most 107 bytes).
    temp_dir = tempfile.mkdtemp(prefix="coderloo-ray-", dir="/tmp")
    written = Path(temp_dir) / "cluster.yaml"
    written.write_text(yaml.safe_dump(cluster))
    # LOOPBACK_ENV reaches the nodes the autoscaler starts too: they bind to 127.0.0.1.
    # PATH: a job's `python` is this venv's, as on cluster.yaml's nodes.
    env = {**os.environ, **ENV_DEFAULTS, **LOOPBACK_ENV, "RAY_FAKE_CLUSTER": "1",
           "AUTOSCALER_UPDATE_INTERVAL_S": str(update_interval_s),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    ray_cli = Path(sys.executable).with_name("ray")
    command = [
        str(ray_cli), "start", "--head", f"--port={port}", "--node-ip-address=127.0.0.1", f"--num-cpus={head_cpus}",
        f"--dashboard-port={dashboard_port}", "--dashboard-host=127.0.0.1", f"--temp-dir={temp_dir}",
        f"--autoscaling-config={written}", "--disable-usage-stats",
    ]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    cluster_handle = LocalCluster(f"127.0.0.1:{port}", f"http://127.0.0.1:{dashboard_port}", temp_dir)
    if done.returncode != 0:
        cluster_handle.stop()
        raise RuntimeError(f"`ray start --head` failed ({done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return cluster_handle


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m coderloo.ops.local_cluster", description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=["up", "down"])
    parser.add_argument("--port", type=int, default=6379, help="the head's GCS port")
    parser.add_argument("--dashboard-port", type=int, default=8265)
    args = parser.parse_args(argv)
    if args.action == "up":
        if STATE_FILE.exists():
            sys.exit(f"a local cluster is up already ({STATE_FILE}); `python -m coderloo.ops.local_cluster down` first")
        cluster = start(args.port, args.dashboard_port)
        STATE_FILE.parent.mkdir(parents=True, exist_ok=True)
        STATE_FILE.write_text(json.dumps(asdict(cluster)))
        print(f"local cluster up: ray.init(address={cluster.gcs_address!r}); dashboard and jobs at {cluster.dashboard_url}")
    else:
        if not STATE_FILE.exists():
            sys.exit(f"no local cluster is up ({STATE_FILE} is missing)")
        LocalCluster(**json.loads(STATE_FILE.read_text())).stop()
        STATE_FILE.unlink()
        print("local cluster down")


if __name__ == "__main__":
    main()
