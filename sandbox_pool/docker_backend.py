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
container is replaced after MAX_RUNS runs or after any anomaly: a timeout, a memory kill, an
infra error, processes that outlived their run, or a report that did not come in time.
"""
from __future__ import annotations

import asyncio
import socket
import struct
import time
import uuid

import docker

from sandbox_pool.image import image_tag
from sandbox_pool.pool import DockerSandbox
from sandbox_pool.process_backend import ANSWER_MARGIN_S, request_frames
from sandbox_pool.protocol import split_frame
from sandbox_pool.results import ExecutionRequest, ExecutionResult, Status
from sandbox_pool.verdict import classify, executed_lines

LABEL = "coderloo.sandbox"  # every sandbox container carries it; its value is the owning backend's `owner`
# What the executor needs: switch uids, signal the sandbox users, clean the scratch dirs, and
# empty a sandboxed process's capability bounding set (SETPCAP) before it drops to the sandbox uid.
CAPABILITIES = ["SETUID", "SETGID", "KILL", "CHOWN", "DAC_OVERRIDE", "FOWNER", "SETPCAP"]
RECYCLE_STATUSES = {Status.timeout, Status.memory_exceeded, Status.infra_error}
START_TIMEOUT_S = 30.0
MAX_RUNS = 200  # runs of one container before it is replaced all the same


class DockerUnavailable(RuntimeError):
    """No Docker engine, or no sandbox image: the message says which and what to do."""


class Container:
    """One warm container and the socket attached to its executor's stdin and stdout."""

    def __init__(self, client: docker.DockerClient, image: str, owner: str, limits: DockerSandbox):
        self.runs = 0
        self._raw = b""  # the attached stream, not yet demultiplexed
        self._buffer = b""  # the executor's stdout, not yet taken as frames
        api = client.api
        host_config = api.create_host_config(
            network_mode="none", read_only=True,
            tmpfs={"/tmp": f"size={limits.tmpfs_mb}m,mode=1777,exec"}, shm_size=f"{limits.tmpfs_mb}m",  # exec: C++ binaries run there
            mem_limit=f"{limits.memory_mb}m", memswap_limit=f"{limits.memory_mb}m", pids_limit=limits.pids,
            nano_cpus=int(limits.cpus * 1e9),
            cap_drop=["ALL"], cap_add=CAPABILITIES, security_opt=["no-new-privileges"], init=True, auto_remove=True,
            runtime=limits.runtime,
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
            while (taken := split_frame(self._buffer)) is None:
                self._receive(self.sock.recv(65536))
            hello, self._buffer = taken
            if not hello.get("ready"):
                raise DockerUnavailable(f"the sandbox executor did not start: {hello}")
            self.sock.setblocking(False)
        except BaseException:
            self.remove()
            raise

    def _receive(self, chunk: bytes) -> None:
        """Take in a chunk of the attached streams, which Docker multiplexes: 8-byte headers (stream,
        size) before each piece. Stdout's pieces are the executor's frames."""
        if not chunk:
            raise EOFError("the sandbox container closed its output")
        self._raw += chunk
        while len(self._raw) >= 8:
            stream, size = self._raw[0], struct.unpack(">I", self._raw[4:8])[0]
            if len(self._raw) < 8 + size:
                break
            if stream == 1:
                self._buffer += self._raw[8:8 + size]
            self._raw = self._raw[8 + size:]

    async def run(self, frames: bytes) -> dict:
        loop = asyncio.get_running_loop()
        self.runs += 1
        await loop.sock_sendall(self.sock, frames)
        while (taken := split_frame(self._buffer)) is None:
            self._receive(await loop.sock_recv(self.sock, 65536))
        report, self._buffer = taken
        return report

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
    """`containers` warm containers, each held to `limits` (the pool's settings of the Docker
    backend); `execute` runs a request in a free one."""

    def __init__(self, containers: int, limits: DockerSandbox | None = None):
        self.limits = limits or DockerSandbox()
        try:
            self.client = docker.from_env()
            self.client.ping()
        except Exception as e:
            raise DockerUnavailable(f"no Docker engine reachable: {e}") from e
        runtimes = sorted(self.client.info().get("Runtimes", {}))
        if self.limits.runtime is not None and self.limits.runtime not in runtimes:
            raise DockerUnavailable(f"the Docker engine has no runtime {self.limits.runtime!r} (reward.pool.backend.runtime); "
                                    f"it has {', '.join(runtimes)}: register it in /etc/docker/daemon.json's runtimes")
        self.image = image_tag()
        try:
            self.client.images.get(self.image)
        except docker.errors.ImageNotFound:
            raise DockerUnavailable(f"sandbox image {self.image} not built: run `make sandbox-image`") from None
        self.owner = uuid.uuid4().hex
        self._size = containers
        self._free: asyncio.Queue | None = None
        self._start: asyncio.Future | None = None  # the warm containers' start, awaited by the first runs
        self._starting: set[asyncio.Task] = set()
        self.recycled = 0
        self.closed = False

    async def _ensure_started(self) -> None:
        """Every run that comes before the containers are up waits for the same start; a start that
        fails fails them all (with its reason), and the next run tries again, instead of waiting
        for a container forever."""
        if self._start is None:
            self._free = asyncio.Queue()
            self._start = asyncio.ensure_future(asyncio.gather(*(self._replace(None) for _ in range(self._size))))
        start = self._start
        try:
            await start
        except BaseException:
            if self._start is start:
                self._start = None
            raise

    async def _replace(self, old: Container | None) -> None:
        if old is not None:
            self.recycled += 1
            await asyncio.to_thread(old.remove)
        for attempt in range(3):
            try:
                container = await asyncio.to_thread(self._new_container)
                break
            except Exception:
                if attempt == 2:
                    raise
                await asyncio.sleep(0.5)
        if container is not None:
            self._free.put_nowait(container)

    def _new_container(self) -> Container | None:
        """A new container, or None (and no container) if the backend was closed meanwhile: the
        check is in the thread that makes it, which runs to its end even when the task that
        awaits it is cancelled (at shutdown), so no container outlives a closed backend."""
        container = Container(self.client, self.image, self.owner, self.limits)
        if self.closed:
            container.remove()
            return None
        return container

    async def execute(self, request: ExecutionRequest) -> ExecutionResult:
        started = time.monotonic()
        try:
            await self._ensure_started()
            container = await self._free.get()
        except Exception as e:
            detail = f"no sandbox container: {type(e).__name__}: {e}"
            return ExecutionResult.build(len(request.tests), Status.infra_error, detail, started=started)
        recycle = container.runs + 1 >= MAX_RUNS
        try:
            report = await asyncio.wait_for(container.run(request_frames(request)),
                                            request.effective_limits.wall_timeout_s + ANSWER_MARGIN_S)
            status, detail, tests = classify(report, request)
            recycle = recycle or status in RECYCLE_STATUSES or bool(report.get("anomaly"))
            result = ExecutionResult.build(len(request.tests), status, detail, started=started, tests=tests,
                                           stdout=report.get("stdout", ""), stderr=report.get("stderr", ""))
            result.lines_executed = executed_lines(report, request)
            return result
        except Exception as e:
            recycle = True
            detail = ("the sandbox container did not answer in time" if isinstance(e, asyncio.TimeoutError)
                      else f"sandbox container failed: {type(e).__name__}: {e}")
            return ExecutionResult.build(len(request.tests), Status.infra_error, detail, started=started)
        finally:
            if recycle:
                task = asyncio.ensure_future(self._replace(container))
                self._starting.add(task)
                task.add_done_callback(self._starting.discard)
            else:
                self._free.put_nowait(container)

    def close(self) -> None:
        """Remove every container of this backend (also those still starting or running)."""
        self.closed = True
        for container in self.client.containers.list(all=True, filters={"label": f"{LABEL}={self.owner}"}):
            try:
                container.remove(force=True)
            except docker.errors.APIError:
                pass
        self._free = None
