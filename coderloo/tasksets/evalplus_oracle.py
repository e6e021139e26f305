"""EvalPlus's output check, as it runs inside the sandbox's trusted tester process.

Standard library only, and self-contained: evalplus.py puts this file's source text into each
HumanEval+ / MBPP+ task's `test_setup`, which the tester runs in a private dict
(`_evalplus = {}; exec(SOURCE, _evalplus)`), then `load(...)` hands it the task's inputs and
expected outputs. Each test is one call, `_evalplus["check"](<entry point>, i)`: it calls the
program's function on input i (the arguments cross to the program's process as plain values)
and compares the result here, in the tester. Expected values never reach the program.

The same file, run as a script, computes expected outputs: it reads canonical solutions and
their inputs (JSON lines on stdin) and writes each output and its run time (evalplus.py runs
it in a subprocess with a timeout).

The rules are EvalPlus's (evalplus/eval/__init__.py `unsafe_execute`, _special_oracle.py, and
`trusted_exec` with `output_not_none` in evalplus/evaluate.py):
  - exact `out == exp`, except:
  - MBPP: `are_equivalent` always passes, `sum_div` also passes with 0, `surface_Area` and
    `digit_distance_nums` also pass when they match EvalPlus's alternative oracle, the
    MBPP_OUTPUT_SET_EQ entry points compare `set(out) == set(exp)`, and for the
    MBPP_OUTPUT_NOT_NONE entry points the expected value is only whether the canonical output
    was None (a bool output is compared with it as is);
  - HumanEval: `find_zero` passes when |poly(xs, out)| <= atol;
  - a zero atol becomes 1e-6 once an expected value is a float or a non-empty list/tuple of
    floats (and stays so for the rest of that input group, as in EvalPlus's loop);
  - with a non-zero atol and no exact match: same type, same length for lists/tuples, and
    numpy.allclose(out, exp, rtol=1e-7, atol) (here in pure Python: element by element;
    numpy would also broadcast length-1 inner dimensions, which this does not).
  - an input passes only within its time limit, max(1 s, 4 x the canonical solution's time on it)
    (EvalPlus's DEFAULT_MIN_TIME_LIMIT and DEFAULT_GT_TIME_LIMIT_FACTOR), wall-clock as EvalPlus's
    alarm: the tester waits that long for the call's answer, then the input and the rest fail, as
    EvalPlus's fast check stops at the first (evalplus.py gives the run EvalPlus's whole-run
    allowance, Task.run_time_s).
"""
import json
import math

MBPP_OUTPUT_NOT_NONE = ("check_str", "text_match_three", "text_starta_endb")
MBPP_OUTPUT_SET_EQ = (
    "similar_elements", "find_char_long", "common_in_nested_lists", "extract_singly", "larg_nnum",
    "intersection_array", "find_dissimilar", "Diff",
)


# An expected output larger than this (encoded) is left out with its input: the program's output
# would have to cross the sandbox's channel and sit in the tester's memory (MBPP+ 255 has plus
# outputs of 27 MB to 1 GB).
MAX_OUTPUT_BYTES = 4 * 2**20


# ---- a JSON form of the plain values tasks use (tuples, sets, dicts, complex, bytes tagged) ----

def encode(value):
    """For trusted values only (inputs, canonical outputs): a dict subclass (Mbpp/88's Counter)
    is written as the plain dict of its items."""
    kind = type(value)
    if value is None or kind in (bool, float, str):
        return value
    if kind is int:
        # Like the sandbox's channel: hex for big ints (json.loads refuses over 4300 decimal digits).
        return value if value.bit_length() <= 10_000 else {"int": format(value, "x")}
    if kind is list:
        return [encode(v) for v in value]
    if kind is tuple:
        return {"tuple": [encode(v) for v in value]}
    if kind is set or kind is frozenset:
        return {kind.__name__: [encode(v) for v in value]}
    if isinstance(value, dict):
        return {"dict": [[encode(k), encode(v)] for k, v in value.items()]}
    if kind is complex:
        return {"complex": [value.real, value.imag]}
    if kind is bytes:
        return {"bytes": value.hex()}
    raise TypeError(f"not a plain value: {kind.__name__}")


def decode(data):
    if type(data) is list:
        return [decode(v) for v in data]
    if type(data) is not dict:
        return data
    (tag, body), = data.items()
    if tag == "tuple":
        return tuple(decode(v) for v in body)
    if tag == "set":
        return {decode(v) for v in body}
    if tag == "frozenset":
        return frozenset(decode(v) for v in body)
    if tag == "dict":
        return {decode(k): decode(v) for k, v in body}
    if tag == "complex":
        return complex(*body)
    if tag == "bytes":
        return bytes.fromhex(body)
    if tag == "int":
        return int(body, 16)
    raise ValueError(f"unknown tag {tag!r}")


# ---- EvalPlus's alternative oracles ----

def _poly(xs, x):
    return sum([coeff * math.pow(x, i) for i, coeff in enumerate(xs)])


def _surface_Area(base_edge, height):
    slant_height = math.sqrt((base_edge / 2) ** 2 + height**2)
    return round(base_edge**2 + 4 * (base_edge * slant_height) / 2)


def _digit_distance_nums(num1, num2):
    a, b = str(num1), str(num2)
    width = max(len(a), len(b))
    return sum(abs(int(x) - int(y)) for x, y in zip(a.zfill(width), b.zfill(width)))


def is_floats(x):
    if isinstance(x, float):
        return True
    if isinstance(x, (list, tuple)) and x:
        return all(isinstance(i, float) for i in x)
    return False


def _number(x):
    return type(x) in (bool, int, float, complex)


def allclose(out, exp, atol, rtol=1e-7):
    """numpy.allclose for nested lists/tuples of numbers; anything numpy cannot compare is not close."""
    if isinstance(out, (list, tuple)) and isinstance(exp, (list, tuple)):
        return len(out) == len(exp) and all(allclose(a, b, atol, rtol) for a, b in zip(out, exp))
    if not (_number(out) and _number(exp)):
        return False
    try:
        if out == exp:  # equal infinities too
            return True
        return abs(out - exp) <= atol + rtol * abs(exp)  # False for NaN
    except OverflowError:
        return False


# ---- the task's data and the check of one input ----

_task = {}


def load(dataset, entry_point, atol, num_base, data, time_limits, call_within):
    """The task: `data` is the JSON text of [[args, expected], ...], base inputs first,
    `time_limits` each input's, in seconds, and `call_within(seconds, fn, *args)` the tester's
    call with a time limit (sandbox_pool.runner.Link.call_within)."""
    _task.update(dataset=dataset, entry_point=entry_point, atol=atol, num_base=num_base,
                 cases=decode(json.loads(data)), time_limits=time_limits, call_within=call_within, group_atol=atol)


def _mbpp_match(entry_point, inp, out, exp):
    """`out == exp`, or EvalPlus's special oracle of an MBPP entry point."""
    if entry_point in MBPP_OUTPUT_NOT_NONE:
        # Before `==`: the output (a re.Match) is not a plain value; only its None-ness crosses.
        exact_match = out == exp if isinstance(out, bool) else exp == (out is not None)
    else:
        exact_match = out == exp
    if entry_point == "are_equivalent":
        return True
    if entry_point == "sum_div":
        return exact_match or out == 0
    if entry_point == "surface_Area":
        return exact_match or abs(out - _surface_Area(*inp)) <= _task["group_atol"]
    if entry_point == "digit_distance_nums":
        return exact_match or out == _digit_distance_nums(*inp)
    if entry_point in MBPP_OUTPUT_SET_EQ:
        return set(out) == set(exp)
    return exact_match


def check(fn, i):
    """Call the program's function on input i and compare as EvalPlus does; raises AssertionError if it
    differs, naming the call, the value returned and the value expected."""
    inp, exp = _task["cases"][i]
    if i == 0 or i == _task["num_base"]:  # EvalPlus checks base and plus inputs in two separate loops
        _task["group_atol"] = _task["atol"]
    out = _task["call_within"](_task["time_limits"][i], fn, *inp)
    entry_point, dataset = _task["entry_point"], _task["dataset"]
    exact_match = _mbpp_match(entry_point, inp, out, exp) if dataset == "mbpp" else out == exp
    if dataset == "humaneval" and entry_point == "find_zero":
        if not abs(_poly(*inp, out)) <= _task["group_atol"]:
            raise AssertionError(f"input {i}: |poly(xs, x)| > {_task['group_atol']} at the returned x")
        return
    if _task["group_atol"] == 0 and is_floats(exp):
        _task["group_atol"] = 1e-6
    atol = _task["group_atol"]
    if not exact_match and atol != 0:
        ok = type(out) is type(exp) and allclose(out, exp, atol)
    else:
        ok = bool(exact_match)
    if not ok:
        # What a programmer's own assert would say: the call, what it returned and what was expected.
        not_none = dataset == "mbpp" and entry_point in MBPP_OUTPUT_NOT_NONE  # exp: was the canonical output not None
        wanted = ("a value other than None" if exp else "None") if not_none else _shown(repr(exp))
        arguments = _shown(", ".join(map(repr, inp)), 2 * SHOWN_CHARS)
        raise AssertionError(f"input {i}: {entry_point}({arguments}) returned {_shown(repr(out))}, expected {wanted}")


# The characters of each value in a failed check's message, so that the message fits the 200 of a
# feedback line (reward_service/scorer.py) with the call and both values (an input can be megabytes).
SHOWN_CHARS = 30


def _shown(text, chars=SHOWN_CHARS):
    return text if len(text) <= chars else text[:chars - 3] + "..."


# ---- expected outputs of canonical solutions (run as a script) ----

def _expected_outputs():
    """stdin: one JSON line per task {"id", "program", "entry_point", "inputs", "not_none"};
    stdout: one JSON line per task {"id", "outputs" (encoded; {"too_large": bytes} over
    MAX_OUTPUT_BYTES), "times"} or {"id", "error"}."""
    import contextlib
    import copy
    import io
    import sys
    import time

    for line in sys.stdin:
        job = json.loads(line)
        try:
            namespace = {"__name__": "__canonical__"}
            with contextlib.redirect_stdout(io.StringIO()):
                exec(compile(job["program"], f"<{job['id']}>", "exec"), namespace)
                fn = namespace[job["entry_point"]]
                outputs, times = [], []
                for args in decode(job["inputs"]):
                    start = time.perf_counter()
                    out = fn(*copy.deepcopy(args))
                    times.append(time.perf_counter() - start)
                    out = encode(out is not None if job["not_none"] else out)
                    size = len(json.dumps(out))
                    outputs.append(out if size <= MAX_OUTPUT_BYTES else {"too_large": size})
                    del out
            reply = {"id": job["id"], "outputs": outputs, "times": times}
        except BaseException as e:
            reply = {"id": job["id"], "error": f"{type(e).__name__}: {str(e)[:300]}"}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    _expected_outputs()
