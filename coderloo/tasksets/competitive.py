"""Competitive-programming task sets as Tasks: APPS, CodeContests, TACO, LiveCodeBench (code
generation), the DeepCoder and Code-R1 training mixtures, and a column mapping for any JSONL or Parquet file of that kind (`generic`).

Each loader reads the records as the Hugging Face datasets publish them:

    apps           codeparrot/apps: train.jsonl, test.jsonl (or the same rows as Parquet)
    codecontests   deepmind/code_contests: data/{train,valid,test}-*.parquet (or the same rows as JSONL)
    taco           BAAI/TACO: ALL/{train,test}-*.parquet (or the same rows as JSONL)
    livecodebench  livecodebench/code_generation_lite: test.jsonl, test2.jsonl, ... (all releases)
    deepcoder      agentica-org/DeepCoder-Preview-Dataset: {lcbv5,primeintellect,taco,codeforces}/{train,test}-*.parquet
    code-r1        ganler/code-r1-12k: train.parquet, test.parquet (verl's RL rows)
    generic        any such file, through a ColumnMapping (tasks.columns)

A path is one file (.jsonl, .jsonl.gz or .parquet) or a directory of them, read in name order.
A file's split is the first word of its name that names one (train, test, valid or validation:
`train-00000-of-00039-e991a271dbfa9925.parquet` is train, `apps-test.jsonl` test), else the
file's own name (`problems.jsonl` is the split `problems`); every LiveCodeBench problem is in the
test split. A malformed record raises TaskFileError naming the
file and line (a Parquet file: its row, from 0) and the reason.

Tests are stdin/stdout cases, or call cases where the record names a function (APPS and TACO
`fn_name`, LiveCodeBench `functional` cases): the entry point is that function, or that method
of the program's `class Solution`. Public cases come first (CodeContests public_tests,
LiveCodeBench public_test_cases) and are the task's shown tests: feedback may quote them, the
statement does; the private and generated cases are held (never quoted). All of them decide the
verdict, as the contests' judges run the examples with the rest. APPS and TACO do not tell them
apart, so every case is held (public_tests 0).
APPS and TACO pass a call case when the result equals the expected value or, when that is a
non-empty list, its first item (their graders do; most expected values are wrapped in a list).

The reference is the record's first Python solution (CodeContests: its first PYTHON3 one), or ""
when it has none: LiveCodeBench has no solutions, and some CodeContests problems have only C++,
Java or Python 2 ones.

Task ids: apps/<split>/<problem_id> (APPS numbers each split from 0), codecontests/<name>,
taco/<split>/<row> (TACO's own task_id is the row in its split), livecodebench/<question_id>.

Left out, since no reward can be computed for them: records without a single test case (APPS
and TACO records whose input_output is ""), and CodeContests problems that read a named file
(input_file, output_file) instead of stdin.

Not reproduced: APPS's and TACO's graders turn the string keys of a dict argument back into
integers; a CallTest's arguments are JSON values, whose object keys are strings.
"""
from __future__ import annotations

import base64
import binascii
import datetime
import io
import json
import math
import pickle
import re
import zlib
from pathlib import Path
from typing import Any, Callable, Iterator

from pydantic import Field, model_validator

from common.config import Section
from reward_service.tasks import Record, Task, TaskFileError, build_tasks, jsonl_records
from sandbox_pool.results import CallTest, IOTest, Test

STDIO_INSTRUCTION = "Write a Python program that reads from standard input and writes to standard output."
CALL_INSTRUCTION = "Write the Python function `{name}`: it is called with each test's arguments and must return the answer."
SPLIT_WORDS = {"train": "train", "test": "test", "valid": "validation", "validation": "validation"}
DATA_SUFFIXES = (".jsonl", ".jsonl.gz", ".parquet")

APPS_LEVELS = {"introductory": 1, "interview": 3, "competition": 5}
TACO_LEVELS = {"EASY": 1, "MEDIUM": 2, "MEDIUM_HARD": 3, "HARD": 4, "VERY_HARD": 5, "UNKNOWN_DIFFICULTY": 3}
LIVECODEBENCH_LEVELS = {"easy": 1, "medium": 3, "hard": 5}
# contest_problem.proto's Difficulty enum: EASY..HARDEST, then Codeforces problem indices (18 is unused)
CODECONTESTS_LEVELS = {0: "UNKNOWN_DIFFICULTY", 1: "EASY", 2: "MEDIUM", 3: "HARD", 4: "HARDER", 5: "HARDEST",
                       6: "EXTERNAL", **dict(zip(range(7, 18), "ABCDEFGHIJK")), **dict(zip(range(19, 30), "LMNOPQRSTUV"))}
# EASY..HARDEST as they are, a Codeforces index A-D as 1-4 (E and later: 5), unknown and external 3
CODECONTESTS_DIFFICULTY = {"UNKNOWN_DIFFICULTY": 3, "EASY": 1, "MEDIUM": 2, "HARD": 3, "HARDER": 4, "HARDEST": 5,
                           "EXTERNAL": 3, "A": 1, "B": 2, "C": 3, "D": 4}
CODECONTESTS_PYTHON3 = 3  # contest_problem.proto's Solution.Language (1 is Python 2)

# (record, split, row) -> the record's Task, or None for a record the loader leaves out; row counts
# the records of the split from 0, across its files in name order
MakeTask = Callable[[Record, str, int], Task | None]


class ColumnMapping(Section):
    """Which columns of a JSONL or Parquet file hold a task's parts, for the generic task set.

    The tests are in one `input_output` column (APPS's form: {inputs, outputs, optional fn_name},
    as an object or a JSON string) or in two columns `inputs` and `outputs` (lists of strings:
    each case's stdin and expected stdout)."""

    id: str = Field(description="Column of the task's id (a string or an integer), unique within a split.")
    prompt: str = Field(description="Column of the problem statement.")
    input_output: str | None = Field(None, description="Column of the tests in APPS's form.")
    inputs: str | None = Field(None, description="Column of each case's stdin (a list of strings), with `outputs`.")
    outputs: str | None = Field(None, description="Column of each case's expected stdout (a list of strings).")
    solutions: str | None = Field(
        None, description="Column of the solutions, the first being the reference: a list of programs, a JSON "
        "string of one, or one program. None: no reference.")
    difficulty: str | None = Field(None, description="Column of a 1-5 difficulty (an integer). None: every task is 3.")
    source: str = Field("generic", min_length=1, description="The tasks' source: their id prefix and by_family key.")

    @model_validator(mode="after")
    def _one_form_of_tests(self) -> "ColumnMapping":
        if (self.inputs is None) != (self.outputs is None):
            raise ValueError("inputs and outputs are given together (each case's stdin and expected stdout)")
        if (self.input_output is None) == (self.inputs is None):
            raise ValueError("name the tests' column: input_output, or inputs and outputs (one of the two forms)")
        return self


def competition_prompt(statement: str, starter_code: str, entry_point: str | None) -> str:
    """The statement, the instruction of the task's kind of test, then the starter code if any."""
    instruction = STDIO_INSTRUCTION if entry_point is None else CALL_INSTRUCTION.format(name=entry_point)
    parts = [statement.strip(), instruction]
    if starter_code.strip():
        parts.append(f"```python\n{starter_code.rstrip()}\n```")
    return "\n\n".join(parts) + "\n"


# --- reading files ---------------------------------------------------------------------------


def data_files(path: Path) -> list[Path]:
    """The file itself, or a directory's .jsonl, .jsonl.gz and .parquet files in name order."""
    if not path.is_dir():
        return [path]
    files = sorted(p for p in path.iterdir() if p.is_file() and p.name.endswith(DATA_SUFFIXES))
    if not files:
        raise TaskFileError(f"{path}: the directory holds no {', '.join(DATA_SUFFIXES)} file")
    return files


def split_of(path: Path) -> str:
    """The split a file's name names: its first word that is train, test, valid or validation. A
    file whose name names none is a split of its own, named by the file (problems.jsonl.gz: problems)."""
    for word in re.split(r"[^a-z]+", path.name.lower()):
        if word in SPLIT_WORDS:
            return SPLIT_WORDS[word]
    return next((path.name.removesuffix(suffix) for suffix in DATA_SUFFIXES if path.name.endswith(suffix)), path.stem)


def table_records(path: Path) -> Iterator[tuple[str, Any]]:
    """(location, record) of each row of a Parquet file (location 'file: row N', from 0), else of each
    line of a JSONL file (reward_service.tasks.jsonl_records)."""
    if path.suffix != ".parquet":
        yield from jsonl_records(path)
        return
    import pyarrow
    import pyarrow.parquet

    row = 0
    try:
        for batch in pyarrow.parquet.ParquetFile(path).iter_batches(batch_size=64):
            for record in batch.to_pylist():
                yield f"{path}: row {row}", record
                row += 1
    except pyarrow.ArrowException as e:
        raise TaskFileError(f"{path}: not a readable Parquet file (after row {row}): {e}") from None


def load_files(path: str | Path, fields: dict[str, type], make_task: MakeTask, split: str | None = None) -> list[Task]:
    """Tasks from a file or a directory of files: each record's `fields` checked (build_tasks),
    then its Task made. `split`: every file's; None: each file's from its name."""
    path = Path(path)
    tasks: list[Task] = []
    rows: dict[str, int] = {}
    seen: dict[str, Path] = {}
    for file in data_files(path):
        file_split = split or split_of(file)

        def make(record: Record, file_split: str = file_split) -> Task | None:
            rows[file_split] = row = rows.get(file_split, -1) + 1
            return make_task(record, file_split, row)

        for task in build_tasks(file, table_records(file), fields, make):
            if task.id in seen:
                raise TaskFileError(f"{file}: task id {task.id!r} is also in {seen[task.id]}")
            seen[task.id] = file
            tasks.append(task)
    return tasks


# --- parts of records ------------------------------------------------------------------------


def field_value(record: Record, name: str, kinds: tuple[type, ...], expected: str) -> Any:
    """record[name], checked to be one of `kinds` (a bool is not an int); a ValueError names the field."""
    if name not in record:
        raise ValueError(f"missing field {name!r}")
    value = record[name]
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        raise ValueError(f"field {name!r} should be {expected}, got {value!r:.80}")
    return value


def parse_json(text: str, field: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"field {field!r} is not valid JSON: {e.msg} (line {e.lineno}, column {e.colno})") from None


def apps_accepted(expected: Any) -> list[Any]:
    """What passes a call case of APPS or TACO: the expected value, or the first item of an expected
    non-empty list (their graders compare with both)."""
    return [expected, expected[0]] if isinstance(expected, list) and expected else [expected]


def input_output_tests(value: str | dict, field: str) -> tuple[list[Test], str | None]:
    """(tests, entry point) of APPS's input_output: {inputs, outputs, optional fn_name}, or its JSON
    text ("": no tests). Without fn_name the cases are stdin/stdout, each a string or a list of
    lines; with it, each input is the list of the function's arguments."""
    if value == "":
        return [], None
    spec = parse_json(value, field) if isinstance(value, str) else value
    if not (isinstance(spec, dict) and isinstance(spec.get("inputs"), list) and isinstance(spec.get("outputs"), list)):
        raise ValueError(f"field {field!r} should be an object with lists 'inputs' and 'outputs', got {value!r:.80}")
    inputs, outputs, fn_name = spec["inputs"], spec["outputs"], spec.get("fn_name")
    if len(inputs) != len(outputs):
        raise ValueError(f"field {field!r} has {len(inputs)} inputs and {len(outputs)} outputs")
    if fn_name is None:
        return [IOTest(stdin=_text(x, field, "inputs", i), stdout=_text(y, field, "outputs", i))
                for i, (x, y) in enumerate(zip(inputs, outputs))], None
    if not isinstance(fn_name, str) or not fn_name:
        raise ValueError(f"field {field!r}: fn_name should be a function name, got {fn_name!r:.80}")
    for i, args in enumerate(inputs):
        if not isinstance(args, list):
            raise ValueError(f"field {field!r}: inputs[{i}] should be the list of {fn_name}'s arguments, got {args!r:.80}")
    return [CallTest(args=args, accepted=apps_accepted(expected)) for args, expected in zip(inputs, outputs)], fn_name


def _text(value: Any, field: str, key: str, index: int) -> str:
    """A stdin/stdout case of APPS: a string, or a list of lines (joined with newlines, as its grader does)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(line, str) for line in value):
        return "\n".join(value)
    raise ValueError(f"field {field!r}: {key}[{index}] should be a string or a list of lines, got {value!r:.80}")


def json_solutions(text: str, field: str) -> list[str]:
    """APPS's and TACO's solutions: a JSON list of programs ("": none)."""
    if text == "":
        return []
    solutions = parse_json(text, field)
    if not isinstance(solutions, list) or not all(isinstance(s, str) for s in solutions):
        raise ValueError(f"field {field!r} should be a JSON list of programs, got {text!r:.80}")
    return solutions


def level_of(record: Record, field: str, levels: dict) -> Any:
    level = record[field]
    if level not in levels:
        raise ValueError(f"field {field!r} should be one of {', '.join(map(str, levels))}, got {level!r:.80}")
    return level


def _quantity(text: str | None, unit: str) -> float | None:
    """The number of '2 seconds', '256 megabytes' (TACO's limits); None for no text or another form."""
    found = re.fullmatch(rf"\s*(\d+(?:\.\d+)?)\s*{unit}s?\s*", text or "", flags=re.IGNORECASE)
    return (float(found.group(1)) if found else 0.0) or None


# --- APPS and TACO ---------------------------------------------------------------------------

APPS_FIELDS = {"problem_id": int, "question": str, "solutions": str, "input_output": str, "difficulty": str,
               "starter_code": str}


def _apps_task(record: Record, split: str, row: int) -> Task | None:
    tests, entry_point = input_output_tests(record["input_output"], "input_output")
    level = level_of(record, "difficulty", APPS_LEVELS)
    solutions = json_solutions(record["solutions"], "solutions")
    if not tests:
        return None
    return Task(
        id=f"apps/{split}/{record['problem_id']}", prompt=competition_prompt(record["question"], record["starter_code"], entry_point),
        tests=tests, entry_point=entry_point, reference=solutions[0] if solutions else "", difficulty=APPS_LEVELS[level],
        source="apps", prompt_is_code=False, split=split, level=level,
    )


def load_apps(path: str | Path) -> list[Task]:
    """codeparrot/apps: train.jsonl and test.jsonl, 5000 problems each (some without tests: left out)."""
    return load_files(path, APPS_FIELDS, _apps_task)


TACO_FIELDS = {"question": str, "solutions": str, "starter_code": str, "input_output": str, "difficulty": str}


def _taco_task(record: Record, split: str, row: int) -> Task | None:
    limit, memory, date = (field_value(record, name, (str, type(None)), "a string or null")
                           for name in ("time_limit", "memory_limit", "date"))
    tests, entry_point = input_output_tests(record["input_output"], "input_output")
    level = level_of(record, "difficulty", TACO_LEVELS)
    solutions = json_solutions(record["solutions"], "solutions")
    if not tests:
        return None
    memory_mb = _quantity(memory, "megabyte")
    try:
        published = datetime.date.fromisoformat(date) if date else None
    except ValueError:
        published = None  # a date TACO wrote in another form: the task has none
    return Task(
        id=f"taco/{split}/{row}", prompt=competition_prompt(record["question"], record["starter_code"], entry_point),
        tests=tests, entry_point=entry_point, reference=solutions[0] if solutions else "", difficulty=TACO_LEVELS[level],
        source="taco", prompt_is_code=False, split=split, level=level, time_limit_s=_quantity(limit, "second"),
        memory_mb=None if memory_mb is None else math.ceil(memory_mb), date=published,
    )


def load_taco(path: str | Path) -> list[Task]:
    """BAAI/TACO: the train (25443 problems) and test (1000) splits. Limits come from time_limit
    ('1 second') and memory_limit ('256 megabytes'), the date from date ('2021-02-23'), when the
    record has them in that form."""
    return load_files(path, TACO_FIELDS, _taco_task)


# --- CodeContests ----------------------------------------------------------------------------

CODECONTESTS_FIELDS = {"name": str, "description": str, "public_tests": dict, "private_tests": dict,
                       "generated_tests": dict, "difficulty": int, "solutions": dict, "memory_limit_bytes": int}


def _cases(record: Record, field: str) -> list[IOTest]:
    """CodeContests' {input: [stdin], output: [stdout]}."""
    value = record[field]
    inputs, outputs = value.get("input"), value.get("output")
    if not (isinstance(inputs, list) and isinstance(outputs, list) and len(inputs) == len(outputs)
            and all(isinstance(text, str) for text in inputs + outputs)):
        raise ValueError(f"field {field!r} should be {{input: [str], output: [str]}} of equal lengths, got {value!r:.80}")
    return [IOTest(stdin=stdin, stdout=stdout) for stdin, stdout in zip(inputs, outputs)]


def _first_python3(record: Record) -> str:
    languages, programs = record["solutions"].get("language"), record["solutions"].get("solution")
    if not (isinstance(languages, list) and isinstance(programs, list) and len(languages) == len(programs)
            and all(isinstance(n, int) for n in languages) and all(isinstance(p, str) for p in programs)):
        raise ValueError(f"field 'solutions' should be {{language: [int], solution: [str]}} of equal lengths, "
                         f"got {record['solutions']!r:.80}")
    return next((program for n, program in zip(languages, programs) if n == CODECONTESTS_PYTHON3), "")


def _time_limit_s(record: Record) -> float | None:
    """time_limit: a protobuf Duration {seconds, nanos}, or null."""
    value = field_value(record, "time_limit", (dict, type(None)), "null or {seconds: int, nanos: int}")
    if value is None:
        return None
    seconds, nanos = value.get("seconds") or 0, value.get("nanos") or 0
    if not (isinstance(seconds, int) and isinstance(nanos, int)):
        raise ValueError(f"field 'time_limit' should be null or {{seconds: int, nanos: int}}, got {value!r:.80}")
    return seconds + nanos / 1e9 or None


def _codecontests_task(record: Record, split: str, row: int) -> Task | None:
    level = CODECONTESTS_LEVELS[level_of(record, "difficulty", CODECONTESTS_LEVELS)]
    public = _cases(record, "public_tests")
    tests = public + _cases(record, "private_tests") + _cases(record, "generated_tests")
    reference, time_limit_s, memory = _first_python3(record), _time_limit_s(record), record["memory_limit_bytes"]
    if not tests or record.get("input_file") or record.get("output_file"):
        return None
    return Task(
        id=f"codecontests/{record['name']}", prompt=competition_prompt(record["description"], "", None), tests=tests,
        reference=reference, difficulty=CODECONTESTS_DIFFICULTY.get(level, 5), source="codecontests",
        prompt_is_code=False, split=split, public_tests=len(public), time_limit_s=time_limit_s,
        memory_mb=-(-memory // 2**20) if memory > 0 else None, level=level,
    )


def load_codecontests(path: str | Path) -> list[Task]:
    """deepmind/code_contests: train (13328 problems, 39 Parquet files: give their directory), valid
    (117), test (165). Tests: public, then private, then generated cases."""
    return load_files(path, CODECONTESTS_FIELDS, _codecontests_task)


# --- LiveCodeBench ---------------------------------------------------------------------------

LIVECODEBENCH_FIELDS = {"question_content": str, "question_id": str, "contest_date": str, "starter_code": str,
                        "difficulty": str, "public_test_cases": str, "private_test_cases": str, "metadata": str}


class _NoGlobalsUnpickler(pickle.Unpickler):
    """Unpickles plain values only: a pickle that asks for any class or function (which is how a
    pickle runs code) is refused before anything is called."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refused: it asks for {module}.{name}, and a pickled string needs no global")


def decompress_test_cases(text: str) -> str:
    """LiveCodeBench's compressed private_test_cases: base64 of zlib of a pickled JSON string. The
    pickle is read by an unpickler that refuses every global, so a record cannot run code here."""
    try:
        payload = zlib.decompress(base64.b64decode(text, validate=True))
    except (binascii.Error, zlib.error) as e:
        raise ValueError(f"not base64 of zlib data: {e}") from None
    try:
        value = _NoGlobalsUnpickler(io.BytesIO(payload)).load()
    except Exception as e:  # a corrupt pickle raises any of a dozen exception types
        raise ValueError(f"not a pickled string: {type(e).__name__}: {e}") from None
    if not isinstance(value, str):
        raise ValueError(f"the pickle holds a {type(value).__name__}, not a JSON string")
    return value


def livecodebench_cases(text: str, field: str) -> list[dict]:
    """A JSON list of {input, output, testtype}, or (a private_test_cases of the later releases) its
    compressed form, which as base64 never starts with '['."""
    if not text.lstrip().startswith("["):
        try:
            text = decompress_test_cases(text)
        except ValueError as e:
            raise ValueError(f"field {field!r} is neither a JSON list nor its compressed form: {e}") from None
    cases = parse_json(text, field)
    if not isinstance(cases, list) or not all(
        isinstance(c, dict) and isinstance(c.get("input"), str) and isinstance(c.get("output"), str)
        and c.get("testtype") in ("stdin", "functional") for c in cases
    ):
        raise ValueError(f"field {field!r} should be a list of {{input: str, output: str, testtype: stdin|functional}}")
    return cases


def livecodebench_test(case: dict, field: str, index: int) -> Test:
    """A stdin case, or a functional one: its input holds one JSON value per line (the arguments),
    its output the JSON value the function returns."""
    if case["testtype"] == "stdin":
        return IOTest(stdin=case["input"], stdout=case["output"])
    try:
        args = [json.loads(line) for line in case["input"].split("\n") if line.strip()]
        expected = json.loads(case["output"])
    except json.JSONDecodeError as e:
        raise ValueError(f"field {field!r}: case {index} is functional but not JSON values: {e.msg}") from None
    return CallTest(args=args, accepted=[expected])


def _livecodebench_task(record: Record, split: str, row: int) -> Task:
    level = level_of(record, "difficulty", LIVECODEBENCH_LEVELS)
    public = livecodebench_cases(record["public_test_cases"], "public_test_cases")
    cases = [("public_test_cases", public), ("private_test_cases",
                                             livecodebench_cases(record["private_test_cases"], "private_test_cases"))]
    tests = [livecodebench_test(case, field, i) for field, part in cases for i, case in enumerate(part)]
    metadata = parse_json(record["metadata"], "metadata")
    entry_point = None
    if any(isinstance(t, CallTest) for t in tests):
        entry_point = metadata.get("func_name") if isinstance(metadata, dict) else None
        if not isinstance(entry_point, str) or not entry_point:
            raise ValueError("functional test cases need metadata's func_name, the function to call")
    try:
        contest_date = datetime.datetime.fromisoformat(record["contest_date"]).date()
    except ValueError:
        raise ValueError(f"field 'contest_date' should be an ISO date and time, got {record['contest_date']!r:.80}") from None
    return Task(
        id=f"livecodebench/{record['question_id']}",
        prompt=competition_prompt(record["question_content"], record["starter_code"], entry_point), tests=tests,
        entry_point=entry_point, reference="", difficulty=LIVECODEBENCH_LEVELS[level], source="livecodebench",
        prompt_is_code=False, split=split, public_tests=len(public), level=level, date=contest_date,
    )


def load_livecodebench(path: str | Path) -> list[Task]:
    """livecodebench/code_generation_lite: a release file (test.jsonl is release_v1, test2.jsonl the
    problems added in v2, ...) or their directory (every release); all in the test split, each
    dated by its contest_date, without reference solutions."""
    return load_files(path, LIVECODEBENCH_FIELDS, _livecodebench_task, split="test")


# --- DeepCoder ---------------------------------------------------------------------------------

DEEPCODER_FIELDS = {"problem": str}
FENCE = re.compile(r"\A\s*```[a-zA-Z0-9]*\n(.*?)\n?```\s*\Z", re.DOTALL)


def _json_field(record: Record, name: str, kinds: tuple[type, ...], expected: str) -> Any:
    """A field that is a value or the JSON text of one (a Parquet string column, or the same nested)."""
    value = field_value(record, name, (str,) + kinds, expected)
    return parse_json(value, name) if isinstance(value, str) else value


def deepcoder_tests(spec: Any, metadata: Any) -> tuple[list[Test], str | None]:
    """DeepCoder's `tests`, in the shape of the subset the row comes from: an object {inputs,
    outputs, fn_name} (taco: APPS's input_output), or a list of cases: {input, output, testtype}
    (lcbv5: LiveCodeBench's, the function named by metadata's func_name), {type: stdin_stdout |
    function_call, input, output, fn_name} (primeintellect: a call's input is its list of arguments,
    its output the expected value wrapped in a list, as TACO's), or {input, output} (codeforces: stdin)."""
    if isinstance(spec, dict):
        return input_output_tests(spec, "tests")
    if not isinstance(spec, list) or not spec or not all(isinstance(case, dict) for case in spec):
        raise ValueError(f"field 'tests' should be an object of inputs and outputs or a list of cases, got {spec!r:.80}")
    if all("testtype" in case for case in spec):
        return _livecodebench_shape(spec, metadata)
    if all("type" in case for case in spec):
        return _primeintellect_shape(spec)
    if all(isinstance(case.get("input"), str) and isinstance(case.get("output"), str) for case in spec):
        return [IOTest(stdin=case["input"], stdout=case["output"]) for case in spec], None
    raise ValueError(f"field 'tests': cases of no known shape, e.g. {spec[0]!r:.80}")


def _livecodebench_shape(spec: list, metadata: Any) -> tuple[list[Test], str | None]:
    tests = [livecodebench_test(case, "tests", i) for i, case in enumerate(livecodebench_cases(json.dumps(spec), "tests"))]
    if not any(isinstance(t, CallTest) for t in tests):
        return tests, None
    name = metadata.get("func_name") if isinstance(metadata, dict) else None
    if not isinstance(name, str) or not name:
        raise ValueError("functional test cases need metadata's func_name, the function to call")
    return tests, name


def _primeintellect_shape(spec: list) -> tuple[list[Test], str | None]:
    tests, names = [], set()
    for i, case in enumerate(spec):
        if case["type"] == "stdin_stdout" and isinstance(case.get("input"), str) and isinstance(case.get("output"), str):
            tests.append(IOTest(stdin=case["input"], stdout=case["output"]))
        elif case["type"] == "function_call" and isinstance(case.get("input"), list) and isinstance(case.get("fn_name"), str):
            tests.append(CallTest(args=case["input"], accepted=apps_accepted(case.get("output"))))
            names.add(case["fn_name"])
        else:
            raise ValueError(f"field 'tests': case {i} should be {{type: stdin_stdout, input: str, output: str}} or "
                             f"{{type: function_call, fn_name: str, input: [arguments], output}}, got {case!r:.80}")
    if len(names) > 1:
        raise ValueError(f"field 'tests' calls several functions: {', '.join(sorted(names))}")
    return tests, next(iter(names), None)


def without_fence(program: str) -> str:
    """A solution written as a markdown code block (PrimeIntellect's gold solutions) as its code."""
    found = FENCE.match(program)
    return found.group(1) + "\n" if found else program


def _deepcoder_task(record: Record, split: str, row: int, subset: str) -> Task | None:
    tests, entry_point = deepcoder_tests(_json_field(record, "tests", (list, dict), "a JSON list or object of test cases"),
                                         _json_field(record, "metadata", (dict,), "an object") if "metadata" in record else {})
    starter = record.get("starter_code") or ""
    solutions = record.get("solutions") or []
    if not isinstance(starter, str) or not isinstance(solutions, list) or not all(isinstance(x, str) for x in solutions):
        raise ValueError("fields 'starter_code' (a string) and 'solutions' (a list of programs) are of the wrong type")
    if not tests:
        return None
    return Task(
        id=f"deepcoder/{subset}/{split}/{row}", prompt=competition_prompt(record["problem"], starter, entry_point),
        tests=tests, entry_point=entry_point, reference=without_fence(solutions[0]) if solutions else "", difficulty=3,
        source="deepcoder", prompt_is_code=False, split=split,
    )


def load_deepcoder(path: str | Path) -> list[Task]:
    """agentica-org/DeepCoder-Preview-Dataset: the dataset's directory (its subsets lcbv5,
    primeintellect, taco and codeforces, each a folder of {train,test}-*.parquet), one subset's
    folder, or one file, whose folder names the subset. Rows have no id: a task is
    deepcoder/<subset>/<split>/<row>."""
    path = Path(path)
    folders = sorted(p for p in path.iterdir() if p.is_dir()) if path.is_dir() else []
    parts = [(folder, folder.name) for folder in folders] or [(path, path.name if path.is_dir() else path.parent.name)]
    tasks: list[Task] = []
    for where, subset in parts:
        tasks += load_files(where, DEEPCODER_FIELDS,
                            lambda record, split, row, subset=subset: _deepcoder_task(record, split, row, subset))
    return tasks


# --- Code-R1 ---------------------------------------------------------------------------------

CODE_R1_FIELDS = {"reward_model": dict}


def _code_r1_task(record: Record, split: str, row: int) -> Task | None:
    messages = field_value(record, "prompt", (list,), "a list of chat messages")
    if not all(isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in messages):
        raise ValueError("field 'prompt' should be a list of chat messages {role, content}")
    users = [m["content"] for m in messages if m["role"] == "user"]
    if not users:
        raise ValueError("field 'prompt' has no user message")
    truth = record["reward_model"].get("ground_truth")
    truth = parse_json(truth, "reward_model.ground_truth") if isinstance(truth, str) else truth
    if isinstance(truth, dict) and isinstance(truth.get("functional"), str):
        tests, entry_point = [truth["functional"]], None  # Python test code run after the program: one test
    elif isinstance(truth, dict) and "inputs" in truth:
        tests, entry_point = input_output_tests(truth, "reward_model.ground_truth")
    else:
        raise ValueError("field 'reward_model.ground_truth' should be {functional: test code} or {inputs, outputs}, "
                         f"got {truth!r:.80}")
    extra = record.get("extra_info") if isinstance(record.get("extra_info"), dict) else {}
    reference = extra.get("reference") if isinstance(extra.get("reference"), str) else ""
    if not tests:
        return None
    return Task(
        id=f"code-r1/{split}/{row}", prompt=users[-1].rstrip() + "\n", tests=tests, entry_point=entry_point,
        reference=reference, difficulty=3, source="code-r1", prompt_is_code=False, split=split,
    )


def load_code_r1(path: str | Path) -> list[Task]:
    """ganler/code-r1-12k (verl's RL format): train.parquet and test.parquet, rows of a chat prompt
    (its last user message is the task's prompt; the run's own system message replaces the row's),
    and the tests in reward_model.ground_truth: {functional: Python test code} (LeetCode, TACO's
    call-based problems: one statement test, run after the program) or {inputs, outputs} (stdin/stdout).
    Rows have no id: a task is code-r1/<split>/<row>."""
    return load_files(path, CODE_R1_FIELDS, _code_r1_task)


# --- generic ---------------------------------------------------------------------------------


def _generic_solutions(record: Record, column: str) -> list[str]:
    value = field_value(record, column, (str, list), "a program, a list of programs or a JSON string of one")
    if isinstance(value, str) and value.lstrip().startswith("["):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            pass  # a program that starts with '['
    if isinstance(value, str):
        return [value]
    if not all(isinstance(s, str) for s in value):
        raise ValueError(f"field {column!r} should be a list of programs, got {value!r:.80}")
    return value


def _generic_task(record: Record, split: str, columns: ColumnMapping) -> Task | None:
    task_id = field_value(record, columns.id, (str, int), "a string or an integer")
    statement = field_value(record, columns.prompt, (str,), "a string")
    if columns.input_output is not None:
        value = field_value(record, columns.input_output, (str, dict), "an object or a JSON string")
        tests, entry_point = input_output_tests(value, columns.input_output)
    else:
        stdins, stdouts = (field_value(record, column, (list,), "a list of strings") for column in (columns.inputs, columns.outputs))
        tests, entry_point = input_output_tests({"inputs": stdins, "outputs": stdouts}, f"{columns.inputs}/{columns.outputs}")
    difficulty = 3
    if columns.difficulty is not None:
        difficulty = field_value(record, columns.difficulty, (int,), "an integer from 1 to 5")
    solutions = _generic_solutions(record, columns.solutions) if columns.solutions is not None else []
    if not tests:
        return None
    return Task(
        id=f"{columns.source}/{split}/{task_id}", prompt=competition_prompt(statement, "", entry_point), tests=tests,
        entry_point=entry_point, reference=solutions[0] if solutions else "", difficulty=difficulty,
        source=columns.source, prompt_is_code=False, split=split,
    )


def load_generic(path: str | Path, columns: ColumnMapping | None = None) -> list[Task]:
    """Any JSONL or Parquet file of competition problems, read through `columns` (tasks.columns)."""
    if columns is None:
        raise ValueError("the generic task set reads its columns from tasks.columns; none are given")
    return load_files(path, {}, lambda record, split, row: _generic_task(record, split, columns))
