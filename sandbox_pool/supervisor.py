"""One run, from request to report: the part of the sandbox that is outside it. Standard library
only; the process backend's fork server and the Docker image's executor both call `supervise`
in a fresh child process (the supervisor) for every run.

The request arrives as two frames (protocol.py), read one at a time:

    1. {"language", "program", "limits"}   what the program's process may know
    2. {"tests", "test_setup", "entry_point"}  what it must never know

Python: the supervisor forks the tester (uid 65533), then the program's process (uid 65534),
and only then reads the second frame and hands the tests to the tester. So the tests are not
even in the memory the program's process inherited. The two talk over a socketpair in plain
values (runner.py); the tester's verdict comes back on a pipe only it holds.

Python stdin/stdout cases: a case server (runner.serve_cases), forked before the cases are read,
forks one run of the program per case; the supervisor feeds each its stdin and compares its
stdout outside the sandbox (Cases).

C++ and JavaScript: the program's process compiles (g++) or parses (node --check) the source;
each case then runs the binary or node in a fresh sandboxed process (exec: nothing of the
supervisor's memory survives) with the case's stdin, and the supervisor compares its stdout with
the expected output, or a call's printed result with the accepted values, outside the sandbox.

Every sandboxed process: a new session, rlimits (CPU, address space, file size, processes, no
core), uid/gid 65534 with no groups, a death signal tied to the supervisor, stdin /dev/null, only
its own pipes, and then (confine.py) no capabilities, no new privileges and a syscall filter.
Where the environment allows (`Isolation`):
- a PID namespace per run (Python: the tester is its init and the program an ordinary process
  in it; C++: one per process, with an init that passes on how it ended), so the kernel kills
  everything the program started when the run ends, with a /proc of its own (hidepid=2: the
  program sees only its own processes, not the tester's);
- the prepared root (isolation.build_root) as /: the system's directories read-only, nothing
  else of the host's files;
- a private mount namespace per run with fresh size-limited tmpfs on /tmp, /var/tmp and /dev/shm;
- a per-run cgroup for pids, memory (whose out-of-memory count decides memory_exceeded) and CPU
  (an equal share per run).
Otherwise (in a container) the supervisor kills every process of uid 65534 after the run and
empties /tmp and /dev/shm; the container's memory cgroup is the evidence of an out-of-memory kill.
"""
import fcntl
import json
import math
import os
import resource
import select
import shutil
import signal
import socket
import sys
import time
from dataclasses import dataclass

import confine
import runner
from confine import CLONE_NEWNS, CLONE_NEWPID
from judge import STDOUT_COMPARE_MAX_BYTES, CaseSeen, judge_case
from kernel import (
    MS_NODEV, MS_NOSUID, MS_PRIVATE, MS_REC, PR_SET_PDEATHSIG, SandboxKiller, check, enter_root, fork_new_pid_namespace,
    kill_all_of, libc, oom_kills, processes_of, remove, set_command_line, write,
)
from protocol import (
    PROGRAM_COMMAND, PROGRAM_NAME, SANDBOX_ENV, SANDBOX_GID, SANDBOX_UID, TESTER_GID, TESTER_UID, frame, read_frame,
    send_frame, write_all,
)
from wait import Wait

CXX = ["g++", "-std=c++17", "-O1", "-pipe", "-o", "prog", "prog.cpp"]
COMPILE_MEMORY_MB = 1024  # cc1plus needs more address space than most programs
# Node reserves more address space than it uses (V8's heap cage): it does not start under 1 GiB of
# RLIMIT_AS. Its heap is bounded by --max-old-space-size at the task's memory limit instead, and
# (where there is one) by the run's memory cgroup.
NODE_MEMORY_MB = 2048
# This file's folder: the fork server's loader says where it is (it names us /sandbox/supervisor.py).
_folder = globals().pop("FOLDER", None) or os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(_folder, "call_harness.js")) as _f:
    CALL_HARNESS = _f.read()
del _folder
SCRATCH_DIRS = ("/tmp", "/var/tmp", "/dev/shm")
DEFAULT_MATCH = {"mode": "tokens", "float_tolerance": 1e-6}  # results.OutputMatch's defaults
# RLIMIT_NPROC counts every process of a uid, so concurrent runs share it: one run's fork bomb
# would make the others' forks fail. Where something else bounds each run (a pids cgroup per
# run, a container per run), the rlimit is only this backstop for all runs together.
SHARED_NPROC = 4096


@dataclass
class Isolation:
    """What this environment lets the supervisor do on top of rlimits and the uid change."""

    drop_privileges: bool  # running as root: switch to the sandbox uids
    pid_namespace: bool  # a PID namespace per run (needs CAP_SYS_ADMIN)
    mount_namespace: bool  # private tmpfs scratch dirs per run (needs CAP_SYS_ADMIN)
    work_root: str  # where the per-run directory goes when there is no mount namespace
    cgroup_roots: dict  # controller ("pids", "memory") -> a directory to make per-run cgroups in
    kill_by_uid: bool  # after each run, kill(-1) as the sandbox uid (no PID namespace to do it)
    run_bounds_processes: bool  # a run's process count is bounded per run (pids cgroup, container), not by RLIMIT_NPROC
    # The prepared root (isolation.build_root) in the server's mount namespace: each sandboxed
    # process chroots into it, with a /proc of its PID namespace. None: the host's / and /proc.
    root: str | None = None
    # A memory cgroup that holds the whole run and no other (the container's own): its out-of-memory
    # kill counter, read before and after the run, says whether the kernel killed for memory.
    memory_cgroup: str | None = None


def supervise(in_fd: int, send_report, iso: Isolation, hangup_fd: int | None = None) -> None:
    """Read one request from `in_fd`, run it, and `send_report(report)` (unless the client hung up:
    `hangup_fd` polls POLLHUP when it does). A clean end of input before a request raises EOFError."""
    head = read_frame(in_fd)
    try:
        run = Run(head, iso, in_fd, hangup_fd)
        try:
            if head["language"] in ("cpp", "javascript"):
                report = run.executable()
            elif head.get("kind") == "stdio":
                report = run.stdio()
            else:
                report = run.python()
        finally:
            run.clean_up()
        failure = run.setup_failure()
        if failure:
            report = {"error": failure} if report is not None else None
        elif report is not None:
            report["anomaly"] = run.anomaly
    except Exception as e:
        report = {"error": f"the sandbox supervisor failed: {type(e).__name__}: {e}"}
    if report is not None:
        send_report(report)


class Run:
    def __init__(self, head: dict, iso: Isolation, in_fd: int, hangup_fd):
        self.head, self.iso, self.in_fd, self.hangup_fd = head, iso, in_fd, hangup_fd
        self.limits = head["limits"]
        self.deadline = time.monotonic() + self.limits["wall_timeout_s"]
        self.workdir = None
        self.cgroups = []
        self.anomaly = None
        self.supervisor = os.pidfd_open(os.getpid())  # a sandbox checks that we are still there
        # Forked before anything of the run exists, so it holds none of the run's descriptors.
        self.killer = SandboxKiller() if iso.kill_by_uid else None
        self.stdout, self.stdout_w = os.pipe()
        self.stderr, self.stderr_w = os.pipe()
        self.output = {self.stdout: b"", self.stderr: b""}
        self.output_bytes = 0
        self.output_exceeded = False
        self.tail_bytes = self.limits["output_tail_kb"] * 1024  # what a report carries of each stream
        self.keep_bytes = self.tail_bytes
        # A sandboxed process that fails to set itself up says why here, not on the run's stderr
        # (which the program's feedback is made of): an infra_error, not the program's.
        self.setup_failures, self.setup_failure_w = os.pipe()
        os.set_blocking(self.setup_failures, False)
        self.killed: set[int] = set()  # pids this supervisor killed (as opposed to the kernel or themselves)
        self.oom_before = oom_kills(iso.memory_cgroup) if iso.memory_cgroup else None
        self.endings: dict[int, int] = {}  # an init's pid -> the pipe it says how its program ended on

    # ---- the two languages ----

    def python(self):
        channel, channel_theirs = socket.socketpair()
        tests_r, tests_w = os.pipe()
        record_r, record_w = os.pipe()
        self.enter_run_namespaces()
        calls = self.head.get("kind") == "call"
        # Call cases: one process answers every call, so each call gets its own CPU limit (the
        # soft RLIMIT_CPU moved up before it) under a hard limit the whole run's wall time bounds.
        case_cpu_s = self.limits["cpu_time_s"] if calls and self.limits.get("case_timeout_s") else None
        cpu_hard = max(case_cpu_s, math.ceil(self.limits["wall_timeout_s"])) + 1 if case_cpu_s else None
        coverage = self.head.get("coverage") is True
        program_body = lambda: runner.serve_program(self.head["program"], 3, lazy_annotations=calls,  # noqa: E731
                                                     case_cpu_s=case_cpu_s, coverage=coverage)
        if self.iso.root:
            # One PID namespace for the run, whose /proc the tester mounts at the root's (in the
            # run's mount namespace): the tester is its init (never in the run's cgroups: the
            # program cannot starve it), the program an ordinary process in it and a child of
            # ours; hidepid hides each from the other. The kernel ends the namespace, and all the
            # program left behind, with the tester.
            tester = self.fork(lambda: self.become_tester(channel_theirs.fileno(), tests_r, record_w),
                               new_pid_namespace=True, with_init=False)
            program = self.fork_into(tester, lambda: self.become_sandbox(channel.fileno(), program_body, own_proc=False,
                                                                          cpu_hard=cpu_hard))
        else:
            tester = self.fork(lambda: self.become_tester(channel_theirs.fileno(), tests_r, record_w))
            program = self.fork(lambda: self.become_sandbox(channel.fileno(), program_body, cpu_hard=cpu_hard),
                                new_pid_namespace=self.iso.pid_namespace)
        os.close(tests_r)
        os.close(record_w)
        channel.close()
        channel_theirs.close()
        self.close_output_ends()
        tail = read_frame(self.in_fd)  # the tests: only now, with the program's process forked
        try:
            send_frame(tests_w, {"tests": tail["tests"], "test_setup": tail["test_setup"], "entry_point": tail["entry_point"],
                                 "kind": self.head.get("kind", "assert"), "match": tail.get("match") or DEFAULT_MATCH,
                                 "case_timeout_s": self.limits.get("case_timeout_s"), "coverage": coverage})
        except OSError:
            pass  # the tester is gone; its missing record says so
        os.close(tests_w)
        watched = self.watch({program: "program", tester: "tester"}, until="tester", records=[record_r])
        if watched is None:
            return None
        record = runner.read_record(watched["records"][record_r])
        report = self.report(watched, tester=record)
        report["tester_process"] = watched["processes"].get("tester")
        report["lines"] = record.get("lines") if coverage and record else None
        return report

    def executable(self):
        """C++ and JavaScript: a process of the program checks the source (g++ compiles it; node
        --check parses it) in the run's directory; then each case runs in a fresh sandboxed process
        (exec: nothing of the supervisor's memory survives) with the case's stdin, and is judged
        here, outside the sandbox (judge.py)."""
        self.enter_run_namespaces()
        language, source = self.head["language"], self.head["program"]

        def compile_it():
            name = "prog.cpp" if language == "cpp" else "prog.js"
            with open(name, "w") as f:
                f.write(source)
            if language == "cpp":
                os.execvpe(CXX[0], CXX, SANDBOX_ENV)
            with open("call_harness.js", "w") as f:
                f.write(CALL_HARNESS)
            os.execvpe("node", ["node", "--check", "prog.js"], SANDBOX_ENV)

        compiler = self.fork(lambda: self.become_sandbox(None, compile_it, compile=True),
                             new_pid_namespace=self.iso.pid_namespace)
        self.close_output_ends()
        tail = read_frame(self.in_fd)
        watched = self.watch({compiler: "program"}, until="program")
        if watched is None:
            return None
        if watched["timed_out"] or watched["processes"]["program"]["exit_code"] != 0:
            report = self.report(watched)
            report["compile_failed"] = True
            return report
        return self.executable_cases(tail, watched)

    def executable_cases(self, tail: dict, watched: dict):
        """Each case in a fresh process of the checked program, until the run's deadline."""
        language, calls = self.head["language"], self.head.get("kind") == "call"
        memory_mb = max(NODE_MEMORY_MB, self.limits["memory_mb"]) if language == "javascript" else None
        if language == "cpp":
            argv = ["./prog"]
        else:  # the heap within the task's memory limit (V8's own would be larger than the address space)
            heap = f"--max-old-space-size={self.limits['memory_mb']}"
            argv = ["node", heap, "call_harness.js", str(tail["entry_point"])] if calls else ["node", heap, "prog.js"]
        outcomes, match = [], tail.get("match") or DEFAULT_MATCH
        self.keep_bytes = max(STDOUT_COMPARE_MAX_BYTES, self.tail_bytes)  # the whole output, to compare and return
        for test in tail["tests"]:
            self.reset_output()
            stdin_r, stdin_w = os.pipe()
            binary = self.fork(lambda: self.become_sandbox(None, lambda: os.execvpe(argv[0], argv, SANDBOX_ENV), stdin=stdin_r,
                                                           memory_mb=memory_mb),
                               new_pid_namespace=self.iso.pid_namespace)
            os.close(stdin_r)
            self.close_output_ends()
            deadline = self.case_deadline()
            stdin = (json.dumps(test["args"]) + "\n" if calls else test["stdin"]).encode()
            watched = self.watch({binary: "program"}, until="program", deadline=deadline, stdin=(stdin_w, stdin))
            if watched is None:
                return None
            if watched["timed_out"] and deadline >= self.deadline:
                break
            seen = CaseSeen(language, watched["processes"]["program"], self.output[self.stdout], self.output[self.stderr],
                            timed_out=watched["timed_out"], case_limit=True, output_exceeded=self.output_exceeded,
                            output_bytes=self.output_bytes)
            outcomes.append(judge_case(seen, test, match, self.limits, calls))
            watched["timed_out"] = False  # the case's own limit: the run goes on
        report = self.report(watched)
        report["case_tests"] = outcomes
        return report

    def case_deadline(self) -> float:
        """The case's own time limit, within the run's."""
        limit = self.limits.get("case_timeout_s")
        return min(self.deadline, time.monotonic() + limit) if limit else self.deadline

    def stdio(self):
        """Python stdin/stdout cases (runner.serve_cases): a case server, forked and compiling the
        program before the cases are read (so none is in the memory it inherited), forks one run
        per case; this process feeds each its stdin, reads its stdout and stderr, ends it at the
        case's time limit and compares its output with the expected one, here."""
        control, control_theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.enter_run_namespaces()
        program = self.head["program"]
        coverage = self.head.get("coverage") is True
        server = self.fork(lambda: self.become_sandbox(control_theirs.fileno(), lambda: runner.serve_cases(program, 3, coverage)),
                           new_pid_namespace=self.iso.pid_namespace)
        control_theirs.close()
        self.close_output_ends()
        tail = read_frame(self.in_fd)  # the cases: only now, with the program's process forked
        match = tail.get("match") or DEFAULT_MATCH
        self.keep_bytes = max(STDOUT_COMPARE_MAX_BYTES, self.tail_bytes)  # each case's whole output, to compare and return
        cases = Cases(self, control, server)
        try:
            load = cases.receive()
            if load is HUNG_UP:
                return None
            outcomes = []
            if isinstance(load, dict) and load.get("status") == "ok":
                for test in tail["tests"]:
                    if time.monotonic() >= self.deadline or cases.gone:
                        break
                    outcome = cases.run(test, match)
                    if outcome is HUNG_UP:
                        return None
                    outcomes.append(outcome)
            elif not (isinstance(load, dict) and load.get("status") == "syntax_error"):
                load = {"status": "lost", "detail": "the program's process ended before it compiled the program"}
        finally:
            ended = cases.close()
        failing = next((o for o in outcomes if not o["passed"]), outcomes[-1] if outcomes else None)
        return {
            "program": ended, "tester": None, "timed_out": time.monotonic() >= self.deadline and len(outcomes) < len(tail["tests"]),
            "output_exceeded": False, "oom_killed": self.oom_killed(), "outlived": False,
            "stdout": (failing or {}).pop("stdout", ""), "stderr": (failing or {}).pop("stderr", ""),
            "load": {"status": str(load["status"]), "detail": str(load.get("detail", ""))[:runner.ERROR_CHARS]},
            "cases": [{k: v for k, v in o.items() if k not in ("stdout", "stderr")} for o in outcomes],
            "lines": sorted(cases.lines) if coverage and cases.lines is not None else None,
        }

    def oom_count(self) -> int:
        """Out-of-memory kills counted so far in the run's memory cgroups (or the container's)."""
        paths = list(self.cgroups) + ([self.iso.memory_cgroup] if self.iso.memory_cgroup else [])
        return sum(count for count in map(oom_kills, paths) if count is not None)

    # ---- processes ----

    def fork(self, body, new_pid_namespace: bool = False, with_init: bool = True) -> int:
        """Start `body` in a child. With `new_pid_namespace`, the child is the init of a PID
        namespace of its own: the kernel kills everything in the namespace when the init ends,
        including processes that left with setsid(). Without `with_init`, `body` is that init
        (the tester: the run's namespace, whose /proc it mounts in the run's mount namespace).
        With it, `body` runs in that init's one child, an ordinary process whose signals (its
        own SIGKILL, SIGXCPU) act as they do anywhere (an init's own do not), in a mount namespace
        of its own for its own /proc where there is a prepared root (C++: one namespace per
        process); the init passes on how it ended (`init`), and the returned pid is the init's."""
        if not new_pid_namespace or not with_init:
            pid = fork_new_pid_namespace() if new_pid_namespace else os.fork()
            if pid == 0:
                run_body(body, self)
            return pid
        ended_r, ended_w = os.pipe()
        pid = fork_new_pid_namespace(CLONE_NEWNS if self.iso.root else 0)
        if pid == 0:
            os.close(ended_r)
            init(body, ended_w, self)
        os.close(ended_w)
        self.endings[pid] = ended_r
        return pid

    def fork_into(self, tester: int, body) -> int:
        """Fork `body` into the tester's PID namespace (setns for our next child, then back). The
        /proc the tester mounts there is in the run's mount namespace, so the program sees it
        whether it chroots before the tester mounts it or after."""
        theirs = os.pidfd_open(tester)
        own = os.open("/proc/self/ns/pid", os.O_RDONLY)
        check(libc.setns(theirs, CLONE_NEWPID), "setns(CLONE_NEWPID)")
        try:
            pid = os.fork()
            if pid == 0:
                run_body(body, self)
        finally:
            check(libc.setns(own, CLONE_NEWPID), "setns back to our PID namespace")
            os.close(own)
            os.close(theirs)
        return pid

    def close_output_ends(self) -> None:
        for fd in ("stdout_w", "stderr_w"):
            if getattr(self, fd) is not None:
                os.close(getattr(self, fd))
                setattr(self, fd, None)

    def reset_output(self) -> None:
        for fd in self.output:
            os.close(fd)
        self.stdout, self.stdout_w = os.pipe()
        self.stderr, self.stderr_w = os.pipe()
        self.output = {self.stdout: b"", self.stderr: b""}
        self.output_bytes = 0

    def common_setup(self, uid: int, gid: int, keep: dict, memory_mb: int, processes: int, cpu_hard: int | None = None) -> None:
        """dup2 `keep` (target fd -> source fd) into place, rlimits, the uid, the death signal, no
        other fds. `cpu_hard`: a hard CPU limit above the soft one's second of margin."""
        null = os.open("/dev/null", os.O_RDWR)
        keep = {0: null, **keep}
        supervisor = fcntl.fcntl(self.supervisor, fcntl.F_DUPFD, 64)  # the shuffle below may reuse its number
        moved = {}
        for target, fd in keep.items():  # first out of the way (above any target), then into place
            moved[target] = fcntl.fcntl(fd, fcntl.F_DUPFD, 64)
        for target, fd in moved.items():
            os.dup2(fd, target, inheritable=target <= 2)
        os.setsid()
        limits = self.limits
        for which, value in [
            # SIGXCPU at the soft limit, the kernel's SIGKILL at the hard one (for a program that
            # ignores SIGXCPU). A second of margin tells that kill apart from others by CPU used.
            (resource.RLIMIT_CPU, (limits["cpu_time_s"], cpu_hard or limits["cpu_time_s"] + 1)),
            (resource.RLIMIT_AS, (memory_mb * 2**20,) * 2),
            (resource.RLIMIT_FSIZE, (limits["file_size_mb"] * 2**20,) * 2),
            (resource.RLIMIT_NPROC, (processes,) * 2),
            (resource.RLIMIT_CORE, (0, 0)),
        ]:
            resource.setrlimit(which, value)
        if self.iso.drop_privileges:
            # Root ignores RLIMIT_NPROC; an ordinary uid cannot fork past it.
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
        # After the uid change, which resets it (and leaves the process undumpable: no other
        # process of the same uid can read its memory through /proc or ptrace it).
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if select.select([supervisor], [], [], 0)[0]:
            os._exit(1)  # the supervisor died before the line above
        failures = fcntl.fcntl(self.setup_failure_w, fcntl.F_DUPFD, max(keep) + 1)
        os.closerange(max(keep) + 1, failures)
        os.closerange(failures + 1, resource.getrlimit(resource.RLIMIT_NOFILE)[1])
        confine.lock_down()  # no new privileges, no capabilities, the syscall filter: for it and all it starts
        os.close(failures)  # set up: from here on a failure is the program's
        self.setup_failure_w = None

    def become_tester(self, channel: int, tests_r: int, record_w: int) -> None:
        if self.iso.root:
            enter_root(self.iso.root)
        os.chdir("/")
        self.common_setup(TESTER_UID, TESTER_GID, {1: self.stdout_w, 2: self.stderr_w, 3: channel, 4: tests_r, 5: record_w},
                          max(256, self.limits["memory_mb"]), 16)
        request = read_frame(4)
        record = runner.run_tests(request, 3, lambda outcomes: write_all(5, b"".join(frame({"test": o}) for o in outcomes)))
        runner.flush_output()
        send_frame(5, record)
        os._exit(0)

    def become_sandbox(self, channel, body, stdin=None, compile=False, own_proc=True, memory_mb=None, cpu_hard=None) -> None:
        """`own_proc`: the first process of its PID namespace, which mounts its /proc (C++); the
        Python program joins the tester's namespace, whose /proc the tester mounts."""
        for path in self.cgroups:  # before the uid change: joining needs root
            with open(os.path.join(path, "cgroup.procs"), "w") as f:
                f.write("0")
        with open("/proc/self/oom_score_adj", "w") as f:  # (the host's /proc: before the root)
            f.write("1000")  # the kernel's out-of-memory killer takes the program first
        if self.iso.root:  # Python: in the tester's PID namespace, whose /proc the tester mounts
            enter_root(self.iso.root, mount_proc=own_proc)
        os.chdir(self.workdir)
        os.environ.clear()
        os.environ.update(SANDBOX_ENV, HOME=self.workdir, TMPDIR=self.workdir)
        # A Python program runs in this process (the others exec): its command line is its own.
        sys.argv, sys.orig_argv = [PROGRAM_NAME], list(PROGRAM_COMMAND)
        set_command_line(PROGRAM_COMMAND)
        keep = {1: self.stdout_w, 2: self.stderr_w}
        if stdin is not None:
            keep[0] = stdin
        if channel is not None:
            keep[3] = channel
        if memory_mb is None:
            memory_mb = max(COMPILE_MEMORY_MB, self.limits["memory_mb"]) if compile else self.limits["memory_mb"]
        processes = SHARED_NPROC if self.iso.run_bounds_processes else self.limits["max_processes"]
        self.common_setup(SANDBOX_UID, SANDBOX_GID, keep, memory_mb, processes, cpu_hard)
        body()

    # ---- the run's namespaces, cgroups and scratch space ----

    def enter_run_namespaces(self) -> None:
        iso = self.iso
        if iso.mount_namespace:
            check(libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
            if iso.root is None:  # (the server's own namespace, which holds the root, is private already)
                check(libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None), "mount --make-rprivate /")
            size = f"size={self.limits['scratch_mb']}m,mode=1777".encode()
            for path in SCRATCH_DIRS:
                where = (iso.root or "") + path  # the prepared root's scratch dirs, or the host's
                if os.path.isdir(where):
                    check(libc.mount(b"tmpfs", where.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, size), f"mount tmpfs on {path}")
            self.workdir = "/tmp"
        else:
            self.workdir = os.path.join(iso.work_root, "sandbox-" + os.urandom(8).hex())
            os.mkdir(self.workdir, 0o700)
            if iso.drop_privileges:
                os.chown(self.workdir, SANDBOX_UID, SANDBOX_GID)
        for controller, root in iso.cgroup_roots.items():
            path = os.path.join(root, "run-" + os.urandom(8).hex())
            os.mkdir(path)
            self.cgroups.append(path)
            if controller == "pids":
                write(path, "pids.max", str(self.limits["max_processes"]))
            elif controller == "cpu":
                pass  # the default share, the same for every run
            elif os.path.exists(os.path.join(path, "memory.max")):
                write(path, "memory.max", str(self.limits["memory_mb"] * 2**20))
                write(path, "memory.swap.max", "0", missing_ok=True)
            else:
                write(path, "memory.limit_in_bytes", str(self.limits["memory_mb"] * 2**20))

    def oom_killed(self) -> bool | None:
        """Whether the kernel killed a process of the run for memory, by its own count: the run's
        memory cgroup, or the container's before and after the run. None: nothing to ask."""
        counts = [oom_kills(path) for path in self.cgroups]
        known = [count for count in counts if count is not None]
        if self.oom_before is not None:
            after = oom_kills(self.iso.memory_cgroup)
            if after is not None:
                known.append(after - self.oom_before)
        return any(count > 0 for count in known) if known else None

    def clean_up(self) -> None:
        if self.iso.kill_by_uid:
            self.killer.kill()
            self.killer.close()
            kill_all_of(TESTER_UID)  # the tester cannot fork much (RLIMIT_NPROC), so forking a killer here is safe
            left = processes_of((SANDBOX_UID, TESTER_UID))
            if left:
                self.anomaly = f"{len(left)} processes of the sandbox users outlived the run"
            for path in SCRATCH_DIRS:
                if os.path.isdir(path):
                    for entry in os.listdir(path):
                        remove(os.path.join(path, entry))
        elif self.workdir and not self.iso.mount_namespace:
            shutil.rmtree(self.workdir, ignore_errors=True)
        for path in self.cgroups:
            for _ in range(100):  # the last processes of the run may take a moment to leave
                try:
                    os.rmdir(path)
                    break
                except OSError:
                    time.sleep(0.01)
            else:
                self.anomaly = f"cgroup {path} still holds processes"

    # ---- watching ----

    def watch(self, pids: dict, until: str, deadline: float | None = None, records=(), stdin: tuple | None = None):
        """Wait for the process named `until` (the others are killed when it ends), the deadline
        (the run's unless given), or the client hanging up (None), reading the output and `records`
        pipes and feeding `stdin` (fd, data) meanwhile. Everything is killed and reaped before this
        returns."""
        live = {os.pidfd_open(pid): (pid, name) for pid, name in pids.items()}
        ended = {}
        wait = Wait(self, self.deadline if deadline is None else deadline, lambda: self.kill_all(live))

        def reap(fd):
            pid, name = live.pop(fd)
            _, status, usage = os.wait4(pid, 0)
            wait.forget(fd)
            os.close(fd)
            ended[name] = {
                **self.how_it_ended(pid, status, usage),
                "killed": pid in self.killed,  # by us: the deadline, the output limit, or the other process ended
            }
            if name == until:
                self.kill_all(live)
            wait.done = not live

        for fd in live:
            wait.on(fd, reap)
        wait.read_output(counted=set(self.output))
        for fd in records:
            wait.record(fd)
        if stdin is not None:
            wait.feed(*stdin)
        try:
            answered = wait.loop()
        finally:
            wait.close()
        if not answered:
            self.kill_all(live)
            for pid, _ in live.values():
                os.wait4(pid, 0)
            return None
        return {"processes": ended, "timed_out": wait.timed_out, "records": wait.records, "outlived": wait.outlived()}

    def setup_failure(self) -> str:
        try:
            return os.read(self.setup_failures, 4096).decode("utf-8", "replace").strip()
        except BlockingIOError:
            return ""

    def how_it_ended(self, pid: int, status: int, usage) -> dict:
        """Exit code or signal, and CPU time: the program's as its init passed them on, else (no
        init, or an init we killed before its program ended) the process's own."""
        ending = self.endings.pop(pid, None)
        if ending is not None:
            os.set_blocking(ending, False)
            try:
                said = os.read(ending, 256).split()
            except OSError:
                said = []
            os.close(ending)
            if len(said) == 3:
                code, sig, cpu_s = said
                return {"exit_code": None if code == b"-" else int(code), "signal": None if sig == b"-" else int(sig),
                        "cpu_s": float(cpu_s)}
        return {"exit_code": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
                "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
                "cpu_s": usage.ru_utime + usage.ru_stime}

    def kill_all(self, live: dict) -> None:
        for pid, _ in live.values():
            self.killed.add(pid)
            try:
                os.kill(pid, signal.SIGKILL)  # a PID namespace's init: the kernel kills everything in it
            except ProcessLookupError:
                pass
        if self.killer is not None:
            self.killer.kill()

    def report(self, watched: dict, tester=None) -> dict:
        return {
            "program": watched["processes"].get("program"),
            "tester": tester,
            "timed_out": watched["timed_out"],
            "output_exceeded": self.output_exceeded,
            "oom_killed": self.oom_killed(),
            "outlived": watched["outlived"],
            "stdout": self.output[self.stdout][-self.tail_bytes:].decode("utf-8", "replace"),
            "stderr": self.output[self.stderr][-self.tail_bytes:].decode("utf-8", "replace"),
        }


HUNG_UP = object()  # the client hung up: the run is abandoned and answers nothing
CASE_SERVER_GRACE_S = 1.0  # for the case server to say how a case it was told to end ended


class Cases:
    """The supervisor's side of a case server (runner.serve_cases): one case at a time."""

    def __init__(self, run: Run, control: socket.socket, server: int):
        self.run_, self.control, self.server = run, control, server
        self.server_fd = os.pidfd_open(server)
        control.setblocking(False)
        self.gone = False  # the case server ended or broke its protocol: no more cases
        self.lines: set[int] | None = None  # with coverage: the program's lines that ran, over the cases that said

    def receive(self, deadline: float | None = None):
        """The case server's next message: a dict (JSON) or ("started", pidfd); None when it ended,
        broke the protocol or the deadline passed; HUNG_UP when the client did."""
        run = self.run_
        got = []
        wait = Wait(run, run.deadline if deadline is None else deadline, kill=lambda: None, kill_grace=0.0)
        self.listen(wait, got, first_only=True)
        if not wait.loop():
            return HUNG_UP
        return got[0] if got else None

    def listen(self, wait: Wait, into: list, first_only: bool) -> None:
        """`wait`'s handlers for the case server: its next message goes into `into` and ends the wait,
        and so does its end (it is then gone). `first_only`: what comes with the message is left unread."""
        def message(fd):
            try:
                data, fds, _, _ = socket.recv_fds(self.control, runner.LINES_BYTES + 4096, 1)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                data, fds = b"", []
            wait.forget(fd)
            if first_only:
                wait.forget(self.server_fd)
            into.append(self.decode(data, fds))
            wait.done = True

        def server_ended(fd):
            self.gone = True
            wait.forget(fd)
            wait.done = True

        wait.on(self.control.fileno(), message)
        wait.on(self.server_fd, server_ended)

    def decode(self, data: bytes, fds: list):
        if data == b"started" and len(fds) == 1:
            return ("started", fds[0])
        for fd in fds:
            os.close(fd)
        try:
            value = json.loads(data) if data else None
        except ValueError:
            value = None
        if not isinstance(value, dict):
            self.gone = True
            return None
        return value

    def run(self, test: dict, match: dict):
        """Run one case; its outcome record, or HUNG_UP."""
        run = self.run_
        run.reset_output()
        stdin_r, stdin_w = os.pipe()
        deadline = run.case_deadline()
        oom_before = run.oom_count()
        try:
            socket.send_fds(self.control, [b"case"], [stdin_r, run.stdout_w, run.stderr_w])
        except OSError:
            self.gone = True
        finally:
            os.close(stdin_r)
            run.close_output_ends()
        started = None if self.gone else self.receive(deadline)
        if not isinstance(started, tuple):
            os.close(stdin_w)
            if started is HUNG_UP:
                return HUNG_UP
            self.gone = True
            return {"passed": False, "end": "lost", "error": "not run: the program's process stopped answering",
                    "stdout": "", "stderr": ""}
        case_fd, answers = started[1], []
        # The case is the case server's child: ended with its pidfd, and its end comes as a message.
        wait = Wait(run, deadline, lambda: kill_case(case_fd), kill_grace=CASE_SERVER_GRACE_S)
        wait.read_output(counted={run.stdout})
        written_before = run.output_bytes  # the run's count goes on across its cases
        wait.feed(stdin_w, test["stdin"].encode())
        self.listen(wait, answers, first_only=False)
        try:
            answered = wait.loop()
        finally:
            os.close(case_fd)
            wait.close()
        if not answered:
            return HUNG_UP
        ended = answers[0] if answers and isinstance(answers[0], dict) else None
        if ended is None:
            self.gone = True  # the case server did not say how the case ended
        elif isinstance(ended.get("lines"), list):
            self.lines = (self.lines or set()) | {n for n in ended["lines"] if type(n) is int and n > 0}
        seen = CaseSeen("python", ended or {}, run.output[run.stdout], run.output[run.stderr], timed_out=wait.timed_out,
                        case_limit=deadline < run.deadline, oom=run.oom_count() > oom_before,
                        output_exceeded=run.output_exceeded, output_bytes=run.output_bytes - written_before)
        outcome = judge_case(seen, test, match, run.limits)
        run.output_exceeded = False
        outcome["stdout"] = run.output[run.stdout][-run.tail_bytes:].decode("utf-8", "replace")
        outcome["stderr"] = run.output[run.stderr][-run.tail_bytes:].decode("utf-8", "replace")
        return outcome

    def close(self) -> dict | None:
        """End the case server (its PID namespace goes with it) and say how it ended."""
        self.control.close()
        run = self.run_
        run.killed.add(self.server)
        try:
            os.kill(self.server, signal.SIGKILL)
        except ProcessLookupError:
            pass
        _, status, usage = os.wait4(self.server, 0)
        os.close(self.server_fd)
        return run.how_it_ended(self.server, status, usage)


def kill_case(case_fd: int) -> None:
    try:
        signal.pidfd_send_signal(case_fd, signal.SIGKILL)
    except (ProcessLookupError, OSError):
        pass


def run_body(body, run: "Run") -> None:
    """A child's life: `body`, then exit. A failure while it sets itself up (until common_setup
    closes `run.setup_failure_w`, just before the program runs) is written there."""
    try:
        body()
    except BaseException as e:
        try:
            if run.setup_failure_w is not None:
                os.write(run.setup_failure_w, f"sandbox set-up failed: {type(e).__name__}: {e}\n".encode())
        finally:
            os._exit(70)
    os._exit(0)


def init(body, ended_w: int, run: "Run") -> None:
    """The init of a sandboxed process's PID namespace: fork the process that runs `body`, reap
    whatever ends in the namespace, and once that process ends write how ("CODE SIGNAL CPU_S", a
    "-" for what does not apply) on `ended_w` and exit, which ends everything left in the
    namespace. It stays root and holds nothing of the run but that pipe; it dies with the
    supervisor."""
    try:
        program = os.fork()
        if program == 0:
            os.close(ended_w)
            run_body(body, run)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        os.closerange(0, ended_w)
        os.closerange(ended_w + 1, resource.getrlimit(resource.RLIMIT_NOFILE)[1])
        while True:
            pid, status, usage = os.wait4(-1, 0)
            if pid == program:
                code = str(os.WEXITSTATUS(status)) if os.WIFEXITED(status) else "-"
                sig = str(os.WTERMSIG(status)) if os.WIFSIGNALED(status) else "-"
                os.write(ended_w, f"{code} {sig} {usage.ru_utime + usage.ru_stime}".encode())
                break
    finally:
        os._exit(0)
