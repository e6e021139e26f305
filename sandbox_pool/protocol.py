"""What the host side of the sandbox and the sandbox side share: who the sandboxed processes run
as and in which environment, and the framing of every channel between the processes of a run.

Standard library only, and no import of its siblings: the package imports it as
`sandbox_pool.protocol`, the sandbox's own scripts (runner.py, supervisor.py, run with -I -S by
the fork server and in the executor image) as `protocol`.

A frame is a 4-byte big-endian length, then that many bytes of JSON.
"""
import json
import os
import struct

SANDBOX_UID = SANDBOX_GID = 65534  # "nobody": the program
TESTER_UID = TESTER_GID = 65533  # the tests: a uid the program cannot signal, trace or read
# Not the host's environment: it may hold credentials.
SANDBOX_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
# What a Python program sees as its command line (sys.argv, /proc/self/cmdline): its own name, the
# one its tracebacks give, and nothing of the sandbox's processes it was forked from.
PROGRAM_NAME = "<program>"
# The tester's function a test setup may call a program's function with, to give the call a time
# limit of its own (EvalPlus's per input): CALL_WITHIN(seconds, fn, *args) (runner.Link.call_within).
CALL_WITHIN = "_sandbox_call_within"
PROGRAM_COMMAND = ["python3", PROGRAM_NAME]
MAX_FRAME_BYTES = 64 * 2**20  # the most `read_frame` takes: a call's arguments or result, encoded


def frame(obj) -> bytes:
    data = json.dumps(obj).encode()
    return struct.pack(">I", len(data)) + data


def split_frame(buffer: bytes):
    """The first frame's value and the bytes after it; None while the frame is incomplete."""
    if len(buffer) < 4:
        return None
    (size,) = struct.unpack(">I", buffer[:4])
    if len(buffer) < 4 + size:
        return None
    return json.loads(buffer[4 : 4 + size]), buffer[4 + size :]


def send_frame(fd: int, obj) -> None:
    write_all(fd, frame(obj))


def write_all(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data) :]


def read_frame(fd: int):
    (size,) = struct.unpack(">I", read_exactly(fd, 4))
    if size > MAX_FRAME_BYTES:
        raise ValueError(f"a message of {size} bytes is over the limit of {MAX_FRAME_BYTES}")
    return json.loads(read_exactly(fd, size))


def read_exactly(fd: int, size: int) -> bytes:
    chunks, left = [], size
    while left:
        chunk = os.read(fd, min(left, 2**20))
        if not chunk:
            raise EOFError("the other side closed the channel")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)
