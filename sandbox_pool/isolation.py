"""The fork server's isolation, set up once when it starts: the network namespace every run
inherits, and what else the machine lets it isolate runs with (the executor image states its own:
container_executor.py). Standard library only, imported by fork_server.py as a sibling.

Each namespace is tried for real in a throwaway child, and the per-run cgroups get roots of the
server's own, made (and tried) here and removed when it exits.
"""
import ctypes
import os

from protocol import SANDBOX_UID
from supervisor import (
    CLONE_NEWNS, MS_NODEV, MS_NOSUID, MS_PRIVATE, MS_REC, Isolation, check, fork_new_pid_namespace, libc, write,
)

CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000


def unshare_network() -> None:
    """A network namespace of our own, with only a loopback that is down (without root: inside a new
    user namespace)."""
    if libc.unshare(CLONE_NEWNET) == 0:
        return
    first = ctypes.get_errno()
    if libc.unshare(CLONE_NEWUSER | CLONE_NEWNET) == 0:
        return
    second = ctypes.get_errno()
    raise OSError(
        second,
        f"cannot isolate the network: unshare(CLONE_NEWNET): {os.strerror(first)}; "
        f"with CLONE_NEWUSER: {os.strerror(second)}",
    )


def probe(work_root: str) -> tuple[Isolation, dict]:
    """What this process may use, found by trying each in a throwaway child; and a summary of it."""
    root = os.geteuid() == 0

    def works(body) -> bool:
        pid = os.fork()
        if pid == 0:
            try:
                body()
                os._exit(0)
            except BaseException:
                os._exit(1)
        return os.waitpid(pid, 0)[1] == 0

    def mounts():
        check(libc.unshare(CLONE_NEWNS), "unshare")
        check(libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None), "private")
        check(libc.mount(b"tmpfs", b"/tmp", b"tmpfs", MS_NOSUID | MS_NODEV, b"size=1m"), "tmpfs")

    def pid_namespace():
        for _ in range(2):
            pid = fork_new_pid_namespace()
            if pid == 0:
                os._exit(0 if os.getpid() == 1 else 1)
            if os.waitpid(pid, 0)[1] != 0:
                raise OSError("not pid 1")

    cgroup_roots, cgroup_reason = make_cgroup_roots() if root else ({}, "not root")
    has_pid_namespace = works(pid_namespace)
    iso = Isolation(
        drop_privileges=root,
        pid_namespace=has_pid_namespace,
        mount_namespace=root and works(mounts),
        work_root=work_root,
        cgroup_roots=cgroup_roots,
        kill_by_uid=root and not has_pid_namespace,
        run_bounds_processes="pids" in cgroup_roots,
    )
    summary = {
        "pid_namespace": iso.pid_namespace,
        "mount_namespace": iso.mount_namespace,
        "cgroups": sorted(cgroup_roots),
        "cgroup_reason": cgroup_reason,
        "uid": SANDBOX_UID if root else os.geteuid(),
    }
    return iso, summary


def make_cgroup_roots() -> tuple[dict, str]:
    """A cgroup of this server's own for each of pids and memory, under the cgroup it runs in.
    Tried for real (make a child, set a limit, remove it): not every machine lets us."""
    try:
        with open("/proc/self/cgroup") as f:
            lines = [line.rstrip("\n").split(":", 2) for line in f]
    except OSError as e:
        return {}, f"cannot read /proc/self/cgroup: {e}"
    roots, reasons = {}, []
    name = f"coderloo-sandbox-{os.getpid()}"
    for controller, limit_file in (("pids", "pids.max"), ("memory", None)):
        candidates = []
        for _, controllers, path in lines:
            if controller in controllers.split(","):
                candidates.append(os.path.join(f"/sys/fs/cgroup/{controller}", path.lstrip("/")))
            if controllers == "" and os.path.exists("/sys/fs/cgroup/cgroup.controllers"):
                candidates.append(os.path.join("/sys/fs/cgroup", path.lstrip("/")))
        for base in candidates:
            path = os.path.join(base, name)
            try:
                os.makedirs(path, exist_ok=True)
                if os.path.exists(os.path.join(base, "cgroup.subtree_control")):
                    write(base, "cgroup.subtree_control", f"+{controller}")
                    write(path, "cgroup.subtree_control", f"+{controller}")
                probe = os.path.join(path, "probe")
                os.mkdir(probe)
                ok = os.path.exists(os.path.join(probe, limit_file or "memory.max")) or os.path.exists(
                    os.path.join(probe, "memory.limit_in_bytes"))
                os.rmdir(probe)
                if ok:
                    roots[controller] = path
                    break
                reasons.append(f"{controller}: no limit file under {base}")
            except OSError as e:
                reasons.append(f"{controller} at {base}: {e.strerror or e}")
                try:
                    os.rmdir(path)
                except OSError:
                    pass
        else:
            if not candidates:
                reasons.append(f"{controller}: controller not mounted")
    return roots, "; ".join(reasons)


def remove_cgroup_roots(roots: dict) -> None:
    for path in roots.values():
        try:
            os.rmdir(path)
        except OSError:
            pass
