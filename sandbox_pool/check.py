"""What isolation a program gets on this machine, per backend (`coderloo sandbox check`): a probe
program run through each backend reports from inside its sandbox what the kernel says of it
(/proc/self/status, its cgroup, the processes, files and network it can see), next to what the
process backend's fork server found it could set up (isolation.probe)."""
from __future__ import annotations

import asyncio
import json
from pathlib import Path

from sandbox_pool.results import ExecutionRequest, Limits, Status

CHECKOUT = str(Path(__file__).resolve().parent.parent)
PROBE = """
import json, os
status = {}
with open('/proc/self/status') as f:
    for line in f:
        key, _, value = line.partition(':')
        status[key] = value.strip()
def read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError as e:
        return ''
interfaces = [line.split(':')[0].strip() for line in read('/proc/net/dev').splitlines()[2:]]
print(json.dumps({
    "uid": status['Uid'].split()[0], "gid": status['Gid'].split()[0], "groups": status.get('Groups', ''),
    "caps": {name: status.get(name) for name in ('CapInh', 'CapPrm', 'CapEff', 'CapBnd', 'CapAmb')},
    "no_new_privs": status.get('NoNewPrivs'), "seccomp": status.get('Seccomp'),
    "processes": len([p for p in os.listdir('/proc') if p.isdigit()]), "cgroup": read('/proc/self/cgroup').split(),
    "interfaces": interfaces, "checkout_visible": os.path.exists(%r),
    "init": read('/proc/1/cmdline').replace('\\0', ' ').strip(),
}))
"""


def probe_request() -> ExecutionRequest:
    return ExecutionRequest(program=PROBE % CHECKOUT, tests=["assert True"], limits=Limits(wall_timeout_s=30.0))


def layers(seen: dict, server: dict | None) -> list[tuple[str, bool, str]]:
    """(layer, in force, evidence) from what the probe saw inside (and the fork server found)."""
    caps = seen["caps"]
    no_caps = all(int(value or "0", 16) == 0 for value in caps.values())
    rows = [
        ("sandbox users", seen["uid"] == "65534" and not seen["groups"],
         f"uid {seen['uid']}, gid {seen['gid']}, groups {seen['groups'] or 'none'}"),
        ("capabilities", no_caps, ", ".join(f"{name} {value}" for name, value in caps.items())),
        ("no_new_privs", seen["no_new_privs"] == "1", f"NoNewPrivs {seen['no_new_privs']}"),
        ("syscall filter", seen["seccomp"] == "2", f"Seccomp {seen['seccomp']} (2: a filter)"),
        # The process backend's own namespace (hidepid: only the program's processes), or the
        # container's, whose init is its executor.
        ("PID namespace", seen["processes"] <= 4 or "container_executor" in seen["init"],
         f"{seen['processes']} processes visible in /proc; pid 1: {seen['init'] or 'hidden'}"),
        ("private root", not seen["checkout_visible"], f"{CHECKOUT} {'visible' if seen['checkout_visible'] else 'not visible'}"),
        ("network namespace", set(seen["interfaces"]) <= {"lo"}, "interfaces: " + (", ".join(seen["interfaces"]) or "none")),
    ]
    if server is not None:  # the process backend: a cgroup of its own per run, for each controller
        cgroups = server.get("cgroups", [])
        in_run = any("coderloo-sandbox-" in line for line in seen["cgroup"])
        rows.append(("cgroups (pids, memory, cpu)", set(cgroups) == {"pids", "memory", "cpu"} and in_run,
                     f"per-run cgroups of {', '.join(cgroups) or 'no controller'}"
                     + (f" ({server['cgroup_reason']})" if server.get("cgroup_reason") else "")))
    else:  # Docker: the container's own cgroup, with DockerSandbox's limits
        rows.append(("cgroups (pids, memory, cpu)", True, "the container's: " + " ".join(seen["cgroup"])[:120]))
    return rows


async def _probe(backend) -> dict:
    result = await backend.execute(probe_request())
    if result.status is not Status.passed:
        raise RuntimeError(f"the probe program did not run: {result.status.value}: {result.detail}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def check(backends: list[str]) -> tuple[str, bool]:
    """The report of each backend's isolation, and whether every backend checked has all of it."""
    from sandbox_pool.process_backend import ForkServer, refusal

    lines, complete = [], True
    for name in backends:
        if name == "process":
            server = ForkServer(weaker_isolation=True)  # to see what it lacks, not only that it refuses
            try:
                seen = asyncio.run(_probe(server))
            finally:
                server.close()
            rows, missing = layers(seen, server.isolation), server.isolation.get("missing", {})
            lines.append("process backend (a fork server per executor)")
        else:
            from sandbox_pool.docker_backend import DockerBackend, DockerUnavailable
            from sandbox_pool.image import image_tag

            try:
                docker = DockerBackend(containers=1)
            except DockerUnavailable as e:
                lines += ["docker backend", f"  unavailable: {e}", ""]
                complete = False
                continue
            try:
                seen = asyncio.run(_probe(docker))
            finally:
                docker.close()
            rows, missing = layers(seen, None), {}
            lines.append(f"docker backend (warm containers of {image_tag()})")
        width = max(len(layer) for layer, _, _ in rows)
        lines += [f"  {layer:{width}s}  {'yes' if ok else 'NO ':3s}  {evidence}" for layer, ok, evidence in rows]
        absent = [layer for layer, ok, _ in rows if not ok]
        if missing:
            lines.append(f"  without weaker_isolation it refuses to run: {refusal(missing)}")
        lines.append(f"  {'all layers in force' if not absent else 'missing: ' + ', '.join(absent)}")
        lines.append("")
        complete = complete and not absent and not missing
    return "\n".join(lines).rstrip(), complete
