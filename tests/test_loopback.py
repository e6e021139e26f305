"""The local Ray instance's servers (GCS, raylet, dashboard agent, workers, the Prometheus metrics
endpoint) listen on loopback only, whatever imported Ray first."""
import ipaddress
import os
import socket
import struct
from pathlib import Path


def _listening() -> dict[int, tuple[str, int]]:
    """Socket inode -> (address, port) of every TCP listener on this machine."""
    found = {}
    for table, family in (("/proc/net/tcp", socket.AF_INET), ("/proc/net/tcp6", socket.AF_INET6)):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] != "0A":  # LISTEN
                continue
            address, port = fields[1].split(":")
            raw = bytes.fromhex(address)
            # the kernel prints each 32-bit word in host (little-endian) order
            raw = b"".join(struct.pack("<I", struct.unpack(">I", raw[i : i + 4])[0]) for i in range(0, len(raw), 4))
            found[int(fields[9])] = (socket.inet_ntop(family, raw), int(port, 16))
    return found


def _descendants(root: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:  # the process ended meanwhile
            continue
        pid, ppid = int(text.split()[0]), int(text.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(pid)
    out, todo = set(), [root]
    while todo:
        pid = todo.pop()
        out.add(pid)
        todo += children.get(pid, [])
    return out


def _sockets_of(pid: int) -> set[int]:
    inodes = set()
    try:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(int(target[8:-1]))
    except OSError:  # the process ended meanwhile
        pass
    return inodes


def _loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    return (getattr(ip, "ipv4_mapped", None) or ip).is_loopback  # ::ffff:127.0.0.1 too


def test_local_ray_listens_on_loopback_only(ray_cluster):
    from coderloo.runtime import metrics_endpoint

    @ray_cluster.remote
    def ping() -> int:
        return os.getpid()

    ray_cluster.get(ping.remote())  # at least one worker process is up
    assert metrics_endpoint().startswith("http://127.0.0.1:")
    listeners = _listening()
    ours = [
        (pid, Path(f"/proc/{pid}/comm").read_text().strip(), *listeners[inode])
        for pid in _descendants(os.getpid()) for inode in _sockets_of(pid) if inode in listeners
    ]
    names = {name for _, name, _, _ in ours}
    assert {"gcs_server", "raylet"} <= names, f"found the listeners of {sorted(names)} only"
    wide = [entry for entry in ours if not _loopback(entry[2])]
    assert not wide, f"listening beyond loopback (pid, process, address, port): {wide}"
