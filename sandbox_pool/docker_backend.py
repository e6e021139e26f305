"""Docker sandbox: warm containers of the executor image, driven through the `docker` SDK.

Each container runs container_executor.py as its main process, with stdin and stdout attached
for the container's whole life: a run costs two frames in and one frame out on that socket, no
`docker run` and no `docker exec`. A container holds one run at a time; `DockerBackend` keeps
`containers` of them warm and hands each request to a free one.

Every container: no network (`network_mode=none`), a read-only root, size-limited tmpfs on /tmp
and /dev/shm, memory (no swap), pids and CPU limits, all capabilities dropped but the few the
executor needs to drop to the sandbox uids and clean up after them, no-new-privileges, tini as
init (reaps orphans), removed when it exits. Inside, each program runs as uid 65534 in its own
session with rlimits, and its tests in a separate tester at uid 65533 (supervisor.py). A
container is replaced after `max_runs` runs or after any anomaly: a timeout, a memory kill, an
infra error, processes that outlived their run, or a report that did not come in time.
"""
from __future__ import annotations

import asyncio
import json
import socket
import struct
import time
import uuid

import docker

from sandbox_pool.image import image_tag
from sandbox_pool.process_backend import ANSWER_MARGIN_S, request_frames
from sandbox_pool.results import ExecutionRequest, ExecutionResult, Status
from sandbox_pool.verdict import classify

LABEL = "coderloo.sandbox"  # every sandbox container carries it; its value names the backend
# What the executor needs: switch uids, signal the sandbox users, and clean the scratch dirs.
CAPABILITIES = ["SETUID", "SETGID", "KILL", "CHOWN", "DAC_OVERRIDE", "FOWNER"]
RECYCLE_STATUSES = {Status.timeout, Status.memory_exceeded, Status.infra_error}
START_TIMEOUT_S = 30.0


class DockerUnavailable(RuntimeError):
    """No Docker engine, or no sandbox image: the message says which and what to do."""


class Container:
    """One warm container and the socket attached to its executor's stdin and stdout."""

    def __init__(self, client: docker.DockerClient, image: str, owner: str, memory_mb: int, pids: int, cpus: float,
                 tmpfs_mb: int):
        self.runs = 0
        api = client.api
        host_config = api.create_host_config(
            network_mode="none", read_only=True,
            tmpfs={"/tmp": f"size={tmpfs_mb}m,mode=1777,exec"}, shm_size=f"{tmpfs_mb}m",  # exec: C++ binaries run there
            mem_limit=f"{memory_mb}m", memswap_limit=f"{memory_mb}m", pids_limit=pids, nano_cpus=int(cpus * 1e9),
            cap_drop=["ALL"], cap_add=CAPABILITIES, security_opt=["no-new-privileges"], init=True, auto_remove=True,
        )
        # stdin_once: when the host's attached socket goes (this process died), the executor sees
        # the end of its input and exits, and auto_remove takes the container away.
        config = api.create_container_config(image, None, stdin_open=True, tty=False, labels={LABEL: owner},
                                             user="0:0", environment={}, host_config=host_config)
        config["StdinOnce"] = True  # the SDK's create_container does not pass it through
        created = api.create_container_from_config(config)
        self.container = client.containers.get(created["Id"])
        try:
            wrapper = client.api.attach_socket(self.container.id, params={"stdin": 1, "stdout": 1, "stream": 1})
            self.sock: socket.socket = wrapper._sock
            self._wrapper = wrapper  # keeps the HTTP response (and so the socket) alive
            self.container.start()
            self.sock.settimeout(START_TIMEOUT_S)
            self._buffer = b""
            hello = self._read_frame_blocking()
            if not hello.get("ready"):
                raise DockerUnavailable(f"the sandbox executor did not start: {hello}")
            self.sock.setblocking(False)
        except BaseException:
            self.remove()
            raise

    def _stdout_bytes(self, chunk: bytes) -> bytes:
        """Docker multiplexes the attached streams: 8-byte headers (stream, size) before each piece."""
        self._raw = getattr(self, "_raw", b"") + chunk
        out = b""
        while len(self._raw) >= 8:
            stream, size = self._raw[0], struct.unpack(">I", self._raw[4:8])[0]
            if len(self._raw) < 8 + size:
                break
            if stream == 1:
                out += self._raw[8:8 + size]
            self._raw = self._raw[8 + size:]
        return out

    def _take_frame(self):
        if len(self._buffer) >= 4:
            size = struct.unpack(">I", self._buffer[:4])[0]
            if len(self._buffer) >= 4 + size:
                frame, self._buffer = self._buffer[4:4 + size], self._buffer[4 + size:]
                return json.loads(frame)
        return None

    def _read_frame_blocking(self) -> dict:
        while (frame := self._take_frame()) is None:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise EOFError("the sandbox container closed its output")
            self._buffer += self._stdout_bytes(chunk)
        return frame

    async def run(self, frames: bytes) -> dict:
        loop = asyncio.get_running_loop()
        self.runs += 1
        await loop.sock_sendall(self.sock, frames)
        while (frame := self._take_frame()) is None:
            chunk = await loop.sock_recv(self.sock, 65536)
            if not chunk:
                raise EOFError("the sandbox container closed its output")
            self._buffer += self._stdout_bytes(chunk)
        return frame

    def remove(self) -> None:
        try:
            self.sock.close()
        except Exception:
            pass
        try:
            self.container.remove(force=True)
        except docker.errors.NotFound:
            pass  # auto_remove got there first
        except docker.errors.APIError as e:
            if "already in progress" not in str(e):
                raise


class DockerBackend:
    """`containers` warm containers; `execute` runs a request in a free one."""

    def __init__(self, containers: int = 4, max_runs: int = 200, image: str | None = None, memory_mb: int = 1024,
                 pids: int = 128, cpus: float = 1.0, tmpfs_mb: int = 64):
        try:
            self.client = docker.from_env()
            self.client.ping()
        except Exception as e:
            raise DockerUnavailable(f"no Docker engine reachable: {e}") from e
        self.image = image or image_tag()
        try:
            self.client.images.get(self.image)
        except docker.errors.ImageNotFound:
            raise DockerUnavailable(f"sandbox image {self.image} not built: run `make sandbox-image`") from None
        self.owner = uuid.uuid4().hex
        self.max_runs = max_runs
        self._settings = dict(memory_mb=memory_mb, pids=pids, cpus=cpus, tmpfs_mb=tmpfs_mb)
        self._size = containers
        self._free: asyncio.Queue | None = None
        self._starting: set[asyncio.Task] = set()
        self.recycled = 0

    async def _ensure_started(self) -> None:
        if self._free is None:
            self._free = asyncio.Queue()
            await asyncio.gather(*(self._replace(None) for _ in range(self._size)))

    async def _replace(self, old: Container | None) -> None:
        if old is not None:
            self.recycled += 1
            await asyncio.to_thread(old.remove)
        for attempt in range(3):
            try:
                container = await asyncio.to_thread(Container, self.client, self.image, self.owner, **self._settings)
                break
            except Exception:
                if attempt == 2:
                    raise
                await asyncio.sleep(0.5)
        self._free.put_nowait(container)

    async def execute(self, request: ExecutionRequest) -> ExecutionResult:
        started = time.monotonic()
        try:
            await self._ensure_started()
            container = await self._free.get()
        except Exception as e:
            return _result(request, started, Status.infra_error, f"no sandbox container: {type(e).__name__}: {e}")
        recycle = container.runs + 1 >= self.max_runs
        try:
            report = await asyncio.wait_for(container.run(request_frames(request)),
                                            request.limits.wall_timeout_s + ANSWER_MARGIN_S)
            status, detail, tests = classify(report, request)
            recycle = recycle or status in RECYCLE_STATUSES or bool(report.get("anomaly"))
            return _result(request, started, status, detail, tests, report.get("stdout", ""), report.get("stderr", ""))
        except asyncio.TimeoutError:
            recycle = True
            return _result(request, started, Status.infra_error, "the sandbox container did not answer in time")
        except Exception as e:
            recycle = True
            return _result(request, started, Status.infra_error, f"sandbox container failed: {type(e).__name__}: {e}")
        finally:
            if recycle:
                task = asyncio.ensure_future(self._replace(container))
                self._starting.add(task)
                task.add_done_callback(self._starting.discard)
            else:
                self._free.put_nowait(container)

    def close(self) -> None:
        """Remove every container of this backend (also those still starting or running)."""
        for container in self.client.containers.list(all=True, filters={"label": f"{LABEL}={self.owner}"}):
            try:
                container.remove(force=True)
            except docker.errors.APIError:
                pass
        self._free = None


def _result(request, started, status, detail, tests=None, stdout="", stderr="") -> ExecutionResult:
    return ExecutionResult(status=status, tests=tests or [], num_tests=len(request.tests),
                           duration_s=time.monotonic() - started, stdout=stdout, stderr=stderr, detail=detail)
