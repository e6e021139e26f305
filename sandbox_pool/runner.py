"""The inside of a process sandbox: runs one program and its tests. Standard library only.

process_backend starts it as `python -I -S runner.py RECORDS_FD` in a sandbox that is already
set up (own session, network and PID namespaces, rlimits, unprivileged uid) and writes the
request to its stdin as JSON: {"program": str, "test_setup": str, "tests": [str]}.

The program's stdout and stderr are the runner's own, which the backend captures. What the
runner has to say goes to RECORDS_FD as JSON lines, so nothing the program prints can pass
for a result:
  {"status", "tests", "detail"}         the outcome, once the program and its tests have run
  {"exit_code", "signal", "cpu_s"}      how the program's process ended, written after it did
"""
import builtins
import ctypes
import json
import os
import signal
import sys

ERROR_CHARS = 500
PR_SET_PDEATHSIG = 1


def main() -> None:
    records_fd = int(sys.argv[1])
    os.set_inheritable(records_fd, False)  # keep it out of the program's own subprocesses
    request = json.loads(sys.stdin.buffer.read())

    # The backend unshared a PID namespace, so this child is its first process (its "init").
    # When it exits the kernel kills and reaps everything the program started, including
    # processes that left the process group with setsid(). As an init it ignores signals it
    # has no handler for (SIGXCPU, an unhandled SIGALRM), except from outside the namespace.
    pid = os.fork()
    if pid == 0:
        # Should this supervisor die (the backend's SIGKILL backstop), take the namespace down too.
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        outcome = run(request)
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass  # the program may have closed or replaced it
        write_record(records_fd, outcome)
        os._exit(0)  # skip the program's atexit handlers and thread joins

    # The backend's wall timeout arrives as SIGTERM: end the program here, so that this process,
    # not the machine's init, reaps it (a zombie still counts against RLIMIT_NPROC).
    signal.signal(signal.SIGTERM, lambda *_: os.kill(pid, signal.SIGKILL))
    _, wait_status, usage = os.wait4(pid, 0)
    write_record(
        records_fd,
        {
            "exit_code": os.WEXITSTATUS(wait_status) if os.WIFEXITED(wait_status) else None,
            "signal": os.WTERMSIG(wait_status) if os.WIFSIGNALED(wait_status) else None,
            "cpu_s": usage.ru_utime + usage.ru_stime,
        },
    )


def run(request: dict) -> dict:
    # Not "__main__": an `if __name__ == "__main__":` block would read stdin or run demos.
    namespace = {"__name__": "__sandbox__", "__builtins__": builtins}
    try:
        program = compile(request["program"], "<program>", "exec")
    except (SyntaxError, ValueError) as e:  # ValueError: null bytes in the source
        return outcome("syntax_error", [], describe(e))

    error = execute(program, namespace)
    if error is not None:
        return outcome(error_status(error), [], "the program raised " + describe(error))
    error = execute(request["test_setup"], namespace, "<test setup>")
    if error is not None:
        return outcome(error_status(error), [], "the test setup raised " + describe(error))

    tests, out_of_memory = [], False
    for i, test in enumerate(request["tests"]):
        error = execute(test, namespace, f"<test {i}>")
        tests.append({"passed": error is None, "error": None if error is None else describe(error)})
        out_of_memory |= isinstance(error, MemoryError)
    if out_of_memory:
        return outcome("memory_exceeded", tests, "a test raised MemoryError")
    if all(test["passed"] for test in tests):
        return outcome("passed", tests, "")
    failed = sum(not test["passed"] for test in tests)
    return outcome("failed", tests, f"{failed} of {len(tests)} tests failed")


def execute(code, namespace: dict, filename: str = "<program>") -> BaseException | None:
    """Compile (when given source) and run; the exception it raised, if any."""
    try:
        if isinstance(code, str):
            code = compile(code, filename, "exec")
        exec(code, namespace)
    except BaseException as e:  # SystemExit too: a program that exits has not passed its tests
        return e
    return None


def error_status(error: BaseException) -> str:
    return "memory_exceeded" if isinstance(error, MemoryError) else "runtime_error"


def describe(error: BaseException) -> str:
    name = type(error).__name__
    try:
        message = str(error)
    except Exception:  # a program's exception class can break __str__
        message = ""
    text = f"{name}: {message}" if message else name
    # Lone surrogates would make the JSON record unreadable as UTF-8.
    return text[:ERROR_CHARS].encode("utf-8", "replace").decode("utf-8")


def outcome(status: str, tests: list, detail: str) -> dict:
    return {"status": status, "tests": tests, "detail": detail}


def write_record(fd: int, record: dict) -> None:
    data = (json.dumps(record) + "\n").encode()
    while data:
        data = data[os.write(fd, data):]


if __name__ == "__main__":
    main()
