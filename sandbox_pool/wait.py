"""The sandbox supervisor's one poll loop (supervisor.py): a run's processes, or one case of a case
server, waited for with their output, record and stdin pipes, the deadline and the client's hang-up.
Standard library only."""
import os
import select
import time

RECORD_MAX_BYTES = 2**20
STOP_GRACE_S = 2.0  # after the sandbox ended, for its output pipes to reach EOF


class Wait:
    """The run's one poll loop. It waits for an end (`done`, which a handler sets: the processes
    reaped, the case server's answer) while it reads the output and record pipes and feeds a
    stdin; at the deadline, or at too much output, it calls `kill` once. After the end it drains
    the pipes for STOP_GRACE_S more: only a process that escaped the run holds one past that.
    `kill_grace`: how long the end may take after a kill (None: until it comes, as it does for our
    own children once killed)."""

    def __init__(self, run, deadline: float, kill, kill_grace: float | None = None):
        self.run, self.deadline, self.kill, self.kill_grace = run, deadline, kill, kill_grace
        self.poller = select.poll()
        self.handlers = {}
        self.draining = set()  # the pipes read to their end before the wait is over
        self.records = {}
        self.stdin, self.data, self.counted = None, b"", set()
        self.done = self.killed = self.timed_out = False
        if run.hangup_fd is not None:
            self.poller.register(run.hangup_fd, 0)  # POLLHUP is always reported

    def on(self, fd: int, handler, events: int = select.POLLIN) -> None:
        self.poller.register(fd, events)
        self.handlers[fd] = handler

    def forget(self, fd: int) -> None:
        self.poller.unregister(fd)
        del self.handlers[fd]
        self.draining.discard(fd)

    def loop(self) -> bool:
        """Until the end and its drain, or a give-up; False when the client hung up."""
        give_up = None
        while True:
            now = time.monotonic()
            if not (self.done or self.killed) and now >= self.deadline:
                self.timed_out = True
                self.end()
            if give_up is None and (self.done or (self.killed and self.kill_grace is not None)):
                give_up = now + (STOP_GRACE_S if self.done else self.kill_grace)
            if (self.done and not self.draining) or (give_up is not None and now >= give_up):
                return True
            wake = give_up if give_up is not None else (None if self.killed else self.deadline)
            ready = self.poller.poll(None if wake is None else max(0.0, wake - now) * 1000)
            if any(fd == self.run.hangup_fd for fd, _ in ready):
                return False
            for fd, _ in ready:
                if fd in self.handlers:  # (an earlier handler may have forgotten it)
                    self.handlers[fd](fd)

    def end(self) -> None:
        self.killed = True
        self.kill()

    def read_output(self, counted: set) -> None:
        """The run's stdout and stderr, keeping the last `keep_bytes` of each; what `counted` writes counts toward the output limit."""
        self.counted = counted
        for fd in self.run.output:
            self.on(fd, self.take_output)
            self.draining.add(fd)

    def take_output(self, fd: int) -> None:
        run = self.run
        chunk = os.read(fd, 65536)
        if not chunk:
            self.forget(fd)
            return
        run.output[fd] = (run.output[fd] + chunk)[-run.keep_bytes:]
        if fd in self.counted:
            run.output_bytes += len(chunk)
        if run.output_bytes > run.limits["output_mb"] * 2**20 and not run.output_exceeded:
            run.output_exceeded = True
            self.end()

    def record(self, fd: int) -> None:
        """A pipe a process of ours writes one record on (the tester's verdict), up to RECORD_MAX_BYTES."""
        self.records[fd] = b""
        self.on(fd, self.take_record)
        self.draining.add(fd)

    def take_record(self, fd: int) -> None:
        chunk = os.read(fd, 65536)
        if not chunk:
            self.forget(fd)
        elif len(self.records[fd]) < RECORD_MAX_BYTES:
            self.records[fd] += chunk

    def feed(self, fd: int, data: bytes) -> None:
        """A case's stdin, as it takes it: a program that never reads it must not hang the wait."""
        os.set_blocking(fd, False)
        self.stdin, self.data = fd, data
        if data:
            self.on(fd, self.write, select.POLLOUT)
        else:
            self.close_stdin()

    def write(self, fd: int) -> None:
        try:
            self.data = self.data[os.write(fd, self.data[:65536]):]
        except BlockingIOError:
            return
        except OSError:
            self.data = b""  # it closed its stdin
        if not self.data:
            self.forget(fd)
            self.close_stdin()

    def close_stdin(self) -> None:
        os.close(self.stdin)
        self.stdin = None

    def outlived(self) -> bool:
        """An output pipe still open: held by a process that escaped the run."""
        return bool(self.draining - set(self.records))

    def close(self) -> None:
        if self.stdin is not None:
            self.close_stdin()
        for fd in self.records:
            os.close(fd)
