"""The two processes of a Python run, and the plain-value codec between them. Standard library only:
this file runs in the fork server (process backend) and in the executor image (Docker backend),
as a script's sibling (`import runner`), never as part of the package.

A Python run has two processes that never share memory, uid or descriptors:

    program (uid 65534)  <── socketpair, plain values only ──>  tester (uid 65533)

`serve_program` runs the program and then answers calls into its namespace. It never sees a
test: it is forked before the tests reach the supervisor, so they are not even in the memory it
inherited. `run_tests` (the tester) runs the test setup and the tests, as trusted code in its own
namespace. Where they use a name the program defines at top level (a function, a class, a
constant), they get a proxy, and every call through a proxy crosses the socket: arguments go in
and results come back as plain builtin values (None, bool, int, float, complex, str, bytes, and
lists, tuples, dicts, sets and frozensets of them), rebuilt from JSON by the tester. Anything else
stays in the program's process and comes back as an opaque handle that can be called, have
attributes read or set, or be passed back as an argument, but never compared, hashed or tested for
truth. So `assert f(3) == 7` is decided in the tester with the tester's own `==` on a value it
built itself; the expected 7 never leaves the tester, and an object whose __eq__ always says True
cannot cross. The tester's verdict goes to the supervisor on a pipe only the tester holds.

The tests keep the tester's builtins: a program that defines `set` or `sorted` does not change
what `assert set(f(x)) == set(expected)` means (both sides would otherwise go through the
program's function and agree on anything). The one exception is the name under test, the
request's `entry_point`, which shadows a builtin as it would in the program's own module (MBPP 126
defines `sum` and tests it).

The test setup runs in the tester even where it builds the program's objects (MBPP 367:
`root = Node(1)`, `root.left = Node(2)`, then `is_tree_balanced(root)`): it gets handles, sets
their attributes across the socket and passes them back. Run in the program's process instead, the
setup would show the program its source and values (EvalPlus's expected outputs are in it), and
whatever it computed for the tests would be the program's to change.
"""
import __future__
import builtins
import io
import json
import math
import os
import resource
import select
import socket
import sys
import time
import traceback

from matching import values_match
from protocol import CALL_WITHIN, read_frame, send_frame, split_frame

ERROR_CHARS = 500  # the most characters of an error text in a record: a test's error, a load or setup detail
MAX_DEPTH = 100  # nesting of a plain value
# The exit code of a stdin/stdout case whose program raised MemoryError. A program that exits
# with it on its own only makes its case read as out of memory: worse for it, never better.
MEMORY_EXIT = 120
LAZY_ANNOTATIONS = __future__.annotations.compiler_flag
LINES_WAIT_S = 2.0  # for the program's process to send the lines it ran, after the last test


# ---- plain values ----

class NotPlain(TypeError):
    pass


def encode(value, handle=None, depth: int = 0):
    """A JSON form of a plain builtin value. Exact types only: a subclass of int or str could
    carry its own __eq__ (a dict subclass crosses as a plain dict of its items). `handle(obj)`
    turns any other object into a reference, or raises."""
    if depth > MAX_DEPTH:
        raise NotPlain("value nested too deeply")
    kind = type(value)
    if value is None or kind is bool or kind is str or kind is float:
        return value
    if kind is int:
        # Big ints travel in hex: parsed in linear time (decimal parsing is quadratic, and
        # json.loads refuses over 4300 digits). HumanEval+ 83 and 139 return such ints.
        return value if value.bit_length() <= 10_000 else {"int": format(value, "x")}
    if kind is list:
        return [encode(v, handle, depth + 1) for v in value]
    if kind is tuple:
        return {"tuple": [encode(v, handle, depth + 1) for v in value]}
    if kind is dict:
        return {"dict": [[encode(k, handle, depth + 1), encode(v, handle, depth + 1)] for k, v in value.items()]}
    if isinstance(value, dict):
        # A dict subclass (Counter, OrderedDict, defaultdict) crosses as the plain dict of its items,
        # read with dict's own method: none of the subclass's behaviour reaches the tester.
        return {"dict": [[encode(k, handle, depth + 1), encode(v, handle, depth + 1)] for k, v in dict.items(value)]}
    if kind is set or kind is frozenset:
        return {kind.__name__: [encode(v, handle, depth + 1) for v in value]}
    if kind is bytes:
        return {"bytes": value.hex()}
    if kind is complex:
        return {"complex": [value.real, value.imag]}
    if handle is None:
        raise NotPlain(f"not a plain value: {kind.__name__}")
    return {"ref": handle(value)}


def decode(data, resolve=None, depth: int = 0):
    """The inverse of `encode`; `resolve(ref)` rebuilds a reference, else references are refused."""
    if depth > MAX_DEPTH:
        raise NotPlain("value nested too deeply")
    kind = type(data)
    if data is None or kind in (bool, int, float, str):
        return data
    if kind is list:
        return [decode(v, resolve, depth + 1) for v in data]
    if kind is not dict or len(data) != 1:
        raise NotPlain(f"malformed value: {str(data)[:80]}")
    (tag, body), = data.items()
    if tag == "ref" and resolve is not None:
        return resolve(body)
    if tag == "bytes" and type(body) is str:
        return bytes.fromhex(body)
    if tag == "int" and type(body) is str:
        return int(body, 16)
    if type(body) is not list:
        raise NotPlain(f"malformed value: {str(data)[:80]}")
    items = [decode(v, resolve, depth + 1) for v in body]
    if tag == "tuple":
        return tuple(items)
    if tag == "set":
        return set(items)
    if tag == "frozenset":
        return frozenset(items)
    if tag == "dict" and all(type(p) is list and len(p) == 2 for p in items):
        return {k: v for k, v in items}
    if tag == "complex" and len(items) == 2 and all(type(x) in (int, float) for x in items):
        return complex(*items)
    raise NotPlain(f"malformed value: {str(data)[:80]}")


def describe(error: BaseException) -> str:
    name = type(error).__name__
    try:
        message = str(error)
    except Exception:  # a program's exception class can break __str__
        message = ""
    text = f"{name}: {message}" if message else name
    # Lone surrogates would make the JSON record unreadable as UTF-8.
    return text[:ERROR_CHARS].encode("utf-8", "replace").decode("utf-8")


# ---- the program's side ----

def line_tracer(lines: set):
    """A sys.settrace function that adds to `lines` each line of the program's code ("<program>")
    that runs, and traces nothing else."""
    def local(frame, event, arg):
        if event == "line":
            lines.add(frame.f_lineno)
        return local

    def calls(frame, event, arg):
        return local if frame.f_code.co_filename == "<program>" else None
    return calls


def serve_program(program: str, channel: int, lazy_annotations: bool = False, case_cpu_s: int | None = None,
                  coverage: bool = False) -> None:
    """Run the program, then answer the tester's calls until it hangs up. Ends the process.

    `lazy_annotations` (call cases): the program is compiled as under `from __future__ import
    annotations`, so LeetCode's starter signatures (`nums: List[int]`) need no typing import,
    as the graders that prepend `from typing import *` give them; the source is unchanged.
    `case_cpu_s` (call cases with a time limit): each call may use that much CPU time of its own,
    its soft RLIMIT_CPU set that far above what the process has used (SIGXCPU past it).
    `coverage`: the program's lines that run, from its load on, are recorded (line_tracer) and
    given to the tester when it asks ({"op": "lines"}) at the end."""
    namespace = {"__name__": "__sandbox__", "__builtins__": builtins}
    objects: list = []  # what references point to

    def handle(obj) -> int:
        objects.append(obj)
        return len(objects) - 1

    wanted = read_frame(channel)["names"]
    executed: set = set()
    try:
        code = compile(program, "<program>", "exec", flags=LAZY_ANNOTATIONS if lazy_annotations else 0)
    except (SyntaxError, ValueError) as e:  # ValueError: null bytes in the source
        load = {"status": "syntax_error", "detail": describe(e)}
    else:
        if coverage:
            sys.settrace(line_tracer(executed))
        try:
            exec(code, namespace)
            load = {"status": "ok", "detail": ""}
        except BaseException as e:  # SystemExit too: a program that exits has not passed its tests
            status = "memory_exceeded" if isinstance(e, MemoryError) else "runtime_error"
            load = {"status": status, "detail": "the program raised " + describe(e)}
    names = {}
    if load["status"] == "ok":
        for name in wanted:
            if name in namespace:
                value = namespace[name]
                names[name] = {"module": value.__name__} if type(value) is type(builtins) else encode(value, handle)
    flush_output()
    send_frame(channel, {"load": load, "names": names})
    while True:
        try:
            message = read_frame(channel)
        except EOFError:
            break
        if message == {"op": "lines"}:
            sys.settrace(None)
            flush_output()
            send_frame(channel, {"lines": sorted(executed)})
            continue
        try:
            target = objects[message["ref"]]
            if message["op"] == "call":
                if case_cpu_s:
                    _allow_cpu(case_cpu_s)
                value = target(*decode(message["args"], objects.__getitem__),
                               **decode(message["kwargs"], objects.__getitem__))
            elif message["op"] == "setattr":
                setattr(target, message["name"], decode(message["value"], objects.__getitem__))
                value = None
            else:
                value = getattr(target, message["name"])
            reply = {"value": encode(value, handle)}
        except BaseException as e:  # the program's own exceptions, SystemExit included
            reply = {"raise": [type(e).__name__, describe(e)]}
        flush_output()
        send_frame(channel, reply)
    flush_output()
    os._exit(0)


def _allow_cpu(seconds: int) -> None:
    used = resource.getrusage(resource.RUSAGE_SELF)
    hard = resource.getrlimit(resource.RLIMIT_CPU)[1]
    resource.setrlimit(resource.RLIMIT_CPU, (min(hard, math.ceil(used.ru_utime + used.ru_stime) + seconds), hard))


# ---- stdin/stdout cases: the program's side ----

def serve_cases(program: str, control: int, coverage: bool = False) -> None:
    """Compile the program once, then run it once per case, each time in a fork of this process
    (no interpreter start per case, and no case sees another's state). The supervisor sends a
    case as one message on `control` (a SOCK_SEQPACKET socket) carrying three descriptors: the
    case's stdin, stdout and stderr pipes. This process forks the run, sends back a pidfd of it
    (the supervisor ends a case that overstays its time limit with it), waits for it and reports
    how it ended. It never sees an expected output: the supervisor compares outside. Ends the
    process when the supervisor closes its end. `coverage`: each case's run records the program's
    lines that ran (line_tracer) and writes them on a pipe of its own as it ends; they come with
    the report of how it ended."""
    sock = socket.socket(fileno=control)
    try:
        code = compile(program, "<program>", "exec")
        load = {"status": "ok", "detail": ""}
    except (SyntaxError, ValueError) as e:  # ValueError: null bytes in the source
        code, load = None, {"status": "syntax_error", "detail": describe(e)}
    sock.send(json.dumps(load).encode())
    while code is not None:
        message, fds, _, _ = socket.recv_fds(sock, 64, 3)
        if not message or len(fds) != 3:
            break
        lines_r, lines_w = os.pipe() if coverage else (None, None)
        pid = os.fork()
        if pid == 0:
            sock.close()
            run_case(code, fds, lines_w)
        for fd in fds:
            os.close(fd)
        if coverage:
            os.close(lines_w)
        pidfd = os.pidfd_open(pid)
        socket.send_fds(sock, [b"started"], [pidfd])
        os.close(pidfd)
        _, status, usage = os.wait4(pid, 0)
        ended = {
            "exit_code": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
            "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
            "cpu_s": usage.ru_utime + usage.ru_stime,
        }
        if coverage:
            ended["lines"] = read_lines(lines_r)
        sock.send(json.dumps(ended).encode())
    os._exit(0)


LINES_BYTES = 60_000  # the most a case's run writes of its lines: under a pipe's 64 KiB, so it never waits


def read_lines(fd: int) -> list | None:
    """A case's lines (run_case's coverage) from the pipe it wrote them on before it ended; None
    when it wrote none (it died first, or exited by os._exit) or something that is not a list."""
    os.set_blocking(fd, False)
    try:
        data = os.read(fd, LINES_BYTES + 1)
    except OSError:
        data = b""
    finally:
        os.close(fd)
    try:
        lines = json.loads(data) if data else None
    except ValueError:
        return None
    return lines if isinstance(lines, list) else None


def run_case(code, fds: list, lines_fd: int | None = None) -> None:
    """One case's run, in a fresh fork: its pipes as stdin, stdout and stderr and no other
    descriptor (but `lines_fd`, as 3, where the lines it ran go with coverage), the program as
    __main__, and its exit status as a judge reads it (0 after the program ran to its end or
    called exit(0))."""
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    if lines_fd is not None:
        os.dup2(lines_fd, 3)
    os.closerange(3 if lines_fd is None else 4, resource.getrlimit(resource.RLIMIT_NOFILE)[0])
    executed: set = set()
    if lines_fd is not None:
        sys.settrace(line_tracer(executed))
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8", errors="replace")
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8", errors="replace")
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8", errors="backslashreplace",
                                  line_buffering=True)
    code_out = 0
    try:
        exec(code, {"__name__": "__main__", "__builtins__": builtins})
    except SystemExit as e:
        code_out = _exit_code(e.code)
    except MemoryError:
        code_out = MEMORY_EXIT
    except BaseException as e:
        try:  # from the program's own frames on: this runner's frame and path are no part of what it said
            traceback.print_exception(type(e), e, e.__traceback__.tb_next)
        except BaseException:
            pass
        code_out = 1
    sys.settrace(None)
    flush_output()
    if lines_fd is not None:
        data = json.dumps(sorted(executed)).encode()
        if len(data) <= LINES_BYTES:
            try:
                os.write(3, data)
            except OSError:
                pass
    os._exit(code_out)


def _exit_code(value) -> int:
    if value is None:
        return 0
    if type(value) is int:
        return value & 0xFF
    try:
        print(value, file=sys.stderr)
    except BaseException:
        pass
    return 1


def flush_output() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass  # the program may have closed or replaced it


# ---- the tester's side ----

class ProgramGone(Exception):
    """The program's process ended (or broke the protocol) before answering."""


class ProgramError(Exception):
    """An exception raised inside the program that has no builtin class of the same name here."""


class Remote:
    """An object that lives in the program's process."""

    __slots__ = ("_link", "_ref", "_type")

    def __init__(self, link, ref, type_name="object"):
        object.__setattr__(self, "_link", link)
        object.__setattr__(self, "_ref", ref)
        object.__setattr__(self, "_type", type_name)

    def __call__(self, *args, **kwargs):
        return self._link.ask({"op": "call", "ref": self._ref, "args": self._link.out(list(args)),
                               "kwargs": self._link.out(kwargs)})

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return self._link.ask({"op": "getattr", "ref": self._ref, "name": name})

    def __setattr__(self, name, value):
        self._link.ask({"op": "setattr", "ref": self._ref, "name": name, "value": self._link.out(value)})

    def _refuse(self, *_):
        raise TypeError("an object of the program is not a plain value; only plain values can be compared or used")

    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = __hash__ = __bool__ = __len__ = __iter__ = _refuse
    __contains__ = __getitem__ = __add__ = __sub__ = __mul__ = __float__ = __int__ = __index__ = _refuse

    def __repr__(self):
        return "<object of the program>"


class CallTimedOut(ProgramGone):
    """A call case's call did not answer within the case time limit (or a test's, CALL_WITHIN)."""



# Tests' outcomes are sent in a batch, at the end or as soon as the program takes this long to
# answer: a run its deadline ends keeps what was finished, and quick tests cost no write each.
SEND_AFTER_S = 0.02


class Link:
    def __init__(self, channel: int, send=None):
        self.channel = channel
        self.gone = False
        self.deadline = None  # time.monotonic() by which a call case's calls must answer; None: the run's deadline
        self.send = send  # send(outcomes): the tests' outcomes not sent yet, out to the supervisor
        self.unsent: list = []

    def ended(self, outcome: dict) -> None:
        self.unsent.append(outcome)

    def call_within(self, seconds: float, fn, *args):
        """`fn(*args)`, a call into the program whose answer is due within `seconds` (a test's own
        time limit, as EvalPlus gives each input): later, CallTimedOut, and the link is done."""
        self.deadline = time.monotonic() + seconds
        try:
            return fn(*args)
        except CallTimedOut:
            raise CallTimedOut(f"no answer within the test's time limit of {seconds:.2f} s") from None
        finally:
            self.deadline = None

    def send_unsent(self) -> None:
        if self.unsent and self.send is not None:
            self.send(self.unsent)
            self.unsent = []

    def out(self, value):
        def handle(obj):
            if type(obj) is Remote:
                return obj._ref
            raise NotPlain(f"a test passed a {type(obj).__name__} to the program; only plain values can cross")
        return encode(value, handle)

    def back(self, data):
        return decode(data, lambda ref: Remote(self, ref) if type(ref) is int else None)

    def lines(self):
        """The program's lines that ran (serve_program's coverage); None when it does not answer at once."""
        try:
            send_frame(self.channel, {"op": "lines"})
            if not select.select([self.channel], [], [], LINES_WAIT_S)[0]:
                return None
            reply = read_frame(self.channel)
        except (OSError, EOFError, ValueError):
            return None
        return reply.get("lines") if type(reply) is dict else None

    def ask(self, message: dict):
        if self.gone:
            raise ProgramGone("the program is no longer running")
        try:
            send_frame(self.channel, message)
            if self.unsent and not select.select([self.channel], [], [], SEND_AFTER_S)[0]:
                self.send_unsent()
            if self.deadline is not None:
                if not select.select([self.channel], [], [], max(0.0, self.deadline - time.monotonic()))[0]:
                    self.gone = True
                    raise CallTimedOut("no answer within the case time limit")
            reply = read_frame(self.channel)
        except (OSError, EOFError, ValueError) as e:
            self.gone = True
            raise ProgramGone("the program stopped answering: " + describe(e)) from None
        if type(reply) is not dict:
            raise ProgramGone("the program broke the protocol")
        if "value" in reply:
            return self.back(reply["value"])
        try:
            name, message = reply["raise"]
            name, message = str(name), str(message)
        except (KeyError, TypeError, ValueError):
            raise ProgramGone("the program broke the protocol") from None
        known = getattr(builtins, name, None)
        if isinstance(known, type) and issubclass(known, Exception):
            try:
                error = known(message.partition(": ")[2])
            except Exception:
                error = ProgramError(message)
        else:
            error = ProgramError(message)  # SystemExit, KeyboardInterrupt and the program's own classes
        raise error


def names_used(code) -> set:
    found = set(code.co_names)
    for const in code.co_consts:
        if hasattr(const, "co_names"):
            found |= names_used(const)
    return found


def run_tests(request: dict, channel: int, send) -> dict:
    """The tester: run the tests against the program over `channel`, their outcomes passed to
    `send(outcomes)` in order, at the latest when the program is slow to answer (what the tester
    finished counts even if the run's deadline ends it); the run's end record, {"load", "lost"}."""
    link = Link(channel, send)
    try:
        record = _run_tests(request, link)
        if request.get("coverage") and record["load"]["status"] == "ok" and not link.gone:
            record["lines"] = link.lines()
        return record
    finally:
        link.send_unsent()


def _run_tests(request: dict, link: "Link") -> dict:
    ended = link.ended
    calls = request["kind"] == "call"
    compiled, wanted = [], set()
    sources = [request["test_setup"]] + ([] if calls else request["tests"])
    if calls:
        wanted = {request["entry_point"], "Solution"}
    for i, source in enumerate(sources):
        try:
            code = compile(source, "<test setup>" if i == 0 else f"<test {i - 1}>", "exec")
            wanted |= names_used(code)
            compiled.append(code)
        except (SyntaxError, ValueError) as e:
            compiled.append(e)
    # a builtin stays the tester's, except the name under test (module docstring); CALL_WITHIN is the tester's
    wanted = {name for name in wanted if (not hasattr(builtins, name) or name == request.get("entry_point"))
              and name != CALL_WITHIN}
    try:
        send_frame(link.channel, {"names": sorted(wanted)})
        hello = read_frame(link.channel)
        load, names = hello["load"], hello["names"]
        status = str(load["status"])
        if status not in ("ok", "syntax_error", "runtime_error", "memory_exceeded"):
            raise ValueError(status)
    except (OSError, EOFError, ValueError, KeyError, TypeError) as e:
        return {"load": {"status": "lost", "detail": describe(e)}, "lost": True}
    if status != "ok":
        return {"load": {"status": status, "detail": str(load.get("detail", ""))[:ERROR_CHARS]}, "lost": False}
    namespace = {"__name__": "__tests__", "__builtins__": builtins}
    for name, data in names.items():
        if name not in wanted:
            continue  # only what was asked for: a forged frame cannot add names, builtins among them
        try:
            if type(data) is dict and set(data) == {"module"}:
                namespace[name] = __import__(str(data["module"]))
            else:
                namespace[name] = link.back(data)
        except Exception:
            pass  # a name the tests cannot use; they fail on it if they need it
    if calls:
        timed_out = run_calls(request, namespace, link, ended)
        # A call that overstayed its limit leaves the link unusable, by the tester's choice: not lost.
        return {"load": {"status": "ok", "detail": ""}, "lost": link.gone and not timed_out}
    setup, tests = compiled[0], compiled[1:]
    namespace[CALL_WITHIN] = link.call_within
    error = execute(setup, namespace)
    if error is not None:
        detail = ("the test setup raised " + describe(error))[:ERROR_CHARS]
        status = "lost" if link.gone else "runtime_error"
        return {"load": {"status": status, "detail": detail}, "lost": link.gone}
    timed_out = False
    for test in tests:
        error = execute(test, namespace)
        late = isinstance(error, CallTimedOut)
        timed_out |= late
        ended({"passed": error is None, "error": None if error is None else describe(error),
               "memory": isinstance(error, MemoryError), **({"timeout": True} if late else {})})
    # a call that overstayed its test's limit leaves the link unusable, by the tester's choice: not lost
    return {"load": {"status": "ok", "detail": ""}, "lost": link.gone and not timed_out}


def read_record(record: bytes) -> dict | None:
    """The tester's verdict from what it wrote: a frame per test as each ended, then the run's end
    ({"load", "lost"}). A tester ended before its last frame (the run's deadline) still leaves the
    tests it finished, marked `cut`; None: it wrote nothing readable."""
    tests, end = [], None
    try:
        while (got := split_frame(record)) is not None:
            value, record = got
            if not isinstance(value, dict):
                return None
            if "test" in value:
                tests.append(value["test"])
            else:
                end = value
                break
    except ValueError:  # not JSON
        return None
    if end is not None:
        return {**end, "tests": tests}
    return {"load": {"status": "ok", "detail": ""}, "tests": tests, "lost": False, "cut": True} if tests else None


def run_calls(request: dict, namespace: dict, link: "Link", ended) -> bool:
    """Call cases: the entry point (a top-level function of the program, else a method of a fresh
    `Solution()` per case, as LeetCode's judge does), each case's arguments in, a plain value out,
    compared here with the accepted values, each outcome passed to `ended`. A case whose calls do
    not answer within the case time limit ends the cases: the program is still in that call, so the
    rest are not run. Whether one did."""
    name, match = request["entry_point"], request["match"]
    timeout = request["case_timeout_s"]
    for i, case in enumerate(request["tests"]):
        if link.gone:
            ended({"passed": False, "error": "not run: the program stopped answering", "memory": False})
            continue
        link.deadline = None if timeout is None else time.monotonic() + timeout
        try:
            if name in namespace:
                target = namespace[name]
            elif "Solution" in namespace:
                target = getattr(namespace["Solution"](), name)
            else:
                raise NameError(f"the program defines neither {name} nor class Solution")
            got = target(*case["args"])
            passed = any(values_match(got, want, match["float_tolerance"]) for want in case["accepted"])
            error = None if passed else f"wrong result: {_shown(got)}"
            memory = False
        except CallTimedOut:
            ended({"passed": False, "error": f"exceeded the case time limit of {timeout:g} s", "memory": False,
                   "timeout": True})
            for _ in request["tests"][i + 1:]:
                ended({"passed": False, "error": "not run: an earlier case exceeded its time limit", "memory": False})
            return True
        except BaseException as e:
            passed, error, memory = False, describe(e), isinstance(e, MemoryError)
        ended({"passed": passed, "error": error, "memory": memory})
    return False


def _shown(value) -> str:
    try:
        text = repr(value)
    except Exception:
        text = "<a value>"
    return text[:200]


def execute(code, namespace: dict):
    """Run compiled test code (or re-raise its compile error); the exception it raised, if any."""
    try:
        if isinstance(code, BaseException):
            raise code
        exec(code, namespace)
    except BaseException as e:
        return e
    return None
