"""The inside of a process sandbox: runs one program and its tests. Standard library only.

fork_server.py calls `run_and_report` in the sandbox's first process, once that process is set
up (own session, network and PID namespaces, rlimits, unprivileged uid, fresh working directory).
The request is a dict: {"program": str, "test_setup": str, "tests": [str], ...}.

The program's stdout and stderr are this process's own, which the supervisor captures. The
outcome goes to a separate records fd as one JSON line, so nothing the program prints can pass
for a result: {"status", "tests", "detail"}. How the process ended (exit code, signal, CPU time)
the supervisor learns from the kernel.
"""
import builtins
import json
import os
import sys

ERROR_CHARS = 500


def run_and_report(request: dict, records_fd: int) -> None:
    """Run the request, write its outcome to `records_fd` and end the process."""
    result = run(request)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass  # the program may have closed or replaced it
    write_record(records_fd, result)
    os._exit(0)  # skip the program's atexit handlers and thread joins


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
