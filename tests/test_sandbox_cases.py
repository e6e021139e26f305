"""stdin/stdout and call-based cases on both sandbox backends: the verdict per case, the case's own
time limit within the run's, the comparison rules, and hundreds of cases in one run. The Docker
half needs the executor image (make sandbox-image); it skips without an engine, or fails where
CODERLOO_REQUIRE_DOCKER=1."""
from __future__ import annotations

import pytest

from sandbox_pool import CallTest, ExecutionRequest, IOTest, Limits, OutputMatch, Status
from sandbox_pool.matching import outputs_match, values_match

SUM = "a, b = map(int, input().split())\nprint(a + b)\n"
SUM_CASES = [IOTest(stdin=f"{a} {b}\n", stdout=f"{a + b}\n") for a, b in [(1, 2), (40, 2), (-5, 5), (10**12, 1)]]


def run(sandbox, program: str, tests, language: str = "python", entry_point=None, match=None, **limits):
    request = ExecutionRequest(program=program, tests=tests, language=language, entry_point=entry_point,
                               match=match or OutputMatch(), limits=Limits(**{"wall_timeout_s": 10.0, **limits}))
    return sandbox[1]([request])[0]


def test_stdio_passes_and_names_the_failing_case(sandbox):
    passed = run(sandbox, SUM, SUM_CASES)
    assert passed.status is Status.passed, passed.detail
    assert [t.passed for t in passed.tests] == [True] * 4
    wrong = run(sandbox, SUM.replace("a + b", "a + b if a < 100 else a - b"), SUM_CASES)
    assert wrong.status is Status.failed
    assert [t.passed for t in wrong.tests] == [True, True, True, False]
    assert wrong.detail.startswith("case 3: wrong output: '999999999999")
    assert wrong.fraction_passed == 0.75


def test_stdio_statuses(sandbox):
    assert run(sandbox, "a, b = map(int, input().split()\n", SUM_CASES).status is Status.syntax_error
    crash = run(sandbox, "raise ValueError('no input today')\n", SUM_CASES)
    assert crash.status is Status.runtime_error
    assert "ValueError: no input today" in crash.tests[0].error
    assert "ValueError: no input today" in crash.stderr  # the first failing case's stderr, for feedback
    # exit(0) after printing is how a contest program may end; a non-zero code is a runtime error
    assert run(sandbox, SUM + "import sys\nsys.exit(0)\n", SUM_CASES).status is Status.passed
    assert run(sandbox, SUM + "import sys\nsys.exit(3)\n", SUM_CASES).status is Status.runtime_error
    main_guard = "def main():\n    print(sum(map(int, input().split())))\nif __name__ == '__main__':\n    main()\n"
    assert run(sandbox, main_guard, SUM_CASES).status is Status.passed


def test_each_case_has_its_own_time_limit_within_the_runs(sandbox):
    slow_on_big = "import time\na, b = map(int, input().split())\nif a > 100:\n    time.sleep(30)\nprint(a + b)\n"
    result = run(sandbox, slow_on_big, SUM_CASES, case_timeout_s=0.5)
    assert result.status is Status.timeout
    assert [t.passed for t in result.tests] == [True, True, True, False]
    assert result.tests[3].error == "exceeded the case time limit of 0.5 s"
    cases = [SUM_CASES[3]] + SUM_CASES[:3]  # the slow case first: the others still run and pass
    result = run(sandbox, slow_on_big, cases, case_timeout_s=0.5)
    assert [t.passed for t in result.tests] == [False, True, True, True]
    # The run's ceiling bounds them all, however many: the cases it leaves are reported as not run.
    result = run(sandbox, "import time\ntime.sleep(0.6)\n" + SUM, SUM_CASES * 3, case_timeout_s=1.0, wall_timeout_s=1.0,
                 max_wall_s=2.0)
    assert result.status is Status.timeout
    assert len(result.tests) == 12 and not any(t.passed for t in result.tests[4:])
    assert any((t.error or "").startswith("not run") for t in result.tests)


def test_a_runs_limits_follow_from_its_cases():
    cases = SUM_CASES * 2
    stdio = ExecutionRequest(program=SUM, tests=cases, limits=Limits(wall_timeout_s=2.0, cpu_time_s=1, case_timeout_s=1.5))
    assert stdio.effective_limits.wall_timeout_s == 2.0 + 8 * 1.5  # the start-up's, then each case's
    assert stdio.effective_limits.cpu_time_s == 2  # never below a case's own time limit
    many = ExecutionRequest(program=SUM, tests=cases * 100, limits=Limits(case_timeout_s=1.5))
    assert many.effective_limits.wall_timeout_s == Limits().max_wall_s
    asserts = ExecutionRequest(program=SUM, tests=["assert True"], limits=Limits(case_timeout_s=1.5))
    assert asserts.effective_limits == asserts.limits  # statements have no per-case limit
    assert ExecutionRequest(program=SUM, tests=cases).effective_limits == Limits()


NEAR_THE_LIMIT = dict(case_timeout_s=1.0, wall_timeout_s=2.0)  # 6 cases of 0.6 s: 3.6 s, past the run's start-up limit


def test_cases_near_their_limit_pass_together(sandbox):
    """A correct program whose cases each take most of their time limit passes, however the cases add
    up (a contest judge's per-case limit): Python stdin/stdout and call cases, C++ and JavaScript."""
    cases = [IOTest(stdin=f"{i} 1\n", stdout=f"{i + 1}\n") for i in range(6)]
    calls = [CallTest(args=[i, 1], accepted=[i + 1]) for i in range(6)]
    programs = [
        ("import time\ntime.sleep(0.6)\n" + SUM, cases, "python", None),
        ("import time\ndef add(a, b):\n    time.sleep(0.6)\n    return a + b\n", calls, "python", "add"),
        ("#include <cstdio>\n#include <unistd.h>\nint main(){long a,b;scanf(\"%ld %ld\",&a,&b);usleep(600000);"
         "printf(\"%ld\\n\",a+b);}\n", cases, "cpp", None),
        ("function add(a, b) { const end = Date.now() + 600; while (Date.now() < end) {} return a + b; }\n", calls,
         "javascript", "add"),
    ]
    for program, tests, language, entry_point in programs:
        limits = NEAR_THE_LIMIT if language == "python" else dict(NEAR_THE_LIMIT, wall_timeout_s=20.0, case_timeout_s=2.0)
        result = run(sandbox, program, tests, language=language, entry_point=entry_point, **limits)
        assert result.status is Status.passed, (language, result.detail)


def test_each_call_case_has_its_own_cpu_limit(sandbox):
    """Call cases run in one process: each call gets CPU time of its own, not a share of the run's."""
    burn = "import time\ndef add(a, b):\n    start = time.process_time()\n" \
           "    while time.process_time() - start < 0.5:\n        pass\n    return a + b\n"
    calls = [CallTest(args=[i, 1], accepted=[i + 1]) for i in range(6)]  # 3 s of CPU in all
    result = run(sandbox, burn, calls, entry_point="add", cpu_time_s=1, case_timeout_s=2.0)
    assert result.status is Status.passed, result.detail
    spin = "def add(a, b):\n    if a:\n        while True:\n            pass\n    return a + b\n"
    result = run(sandbox, spin, calls[:3], entry_point="add", cpu_time_s=1, case_timeout_s=2.0)
    assert result.status is Status.timeout and [t.passed for t in result.tests] == [True, False, False], result.detail


def test_a_call_case_cut_by_the_runs_limit_leaves_the_finished_ones_their_credit(sandbox):
    slow = "import time\ndef add(a, b):\n    time.sleep(0.3 if a < 10 else 30)\n    return a + b\n"
    calls = [CallTest(args=[1, 1], accepted=[2]), CallTest(args=[2, 1], accepted=[3]), CallTest(args=[10, 1], accepted=[11])]
    result = run(sandbox, slow, calls, entry_point="add", case_timeout_s=10.0, wall_timeout_s=2.0, max_wall_s=3.0)
    assert result.status is Status.timeout, result.detail
    assert [t.passed for t in result.tests] == [True, True, False]
    assert result.tests[2].error == "not run: the run's wall-clock limit ended first"


def test_hundreds_of_cases_run_in_one_run(sandbox):
    cases = [IOTest(stdin=f"{i} {i}\n", stdout=f"{2 * i}\n") for i in range(300)]
    cases[217] = IOTest(stdin="217 217\n", stdout="0\n")
    result = run(sandbox, SUM, cases, wall_timeout_s=30.0)
    assert result.status is Status.failed
    assert result.num_passed == 299 and not result.tests[217].passed
    assert result.detail.startswith("case 217: ")


def test_an_output_too_long_to_compare_fails_whatever_its_end(sandbox):
    """A case's stdout is compared whole or not at all: over 1 MiB, what a compared tail would show
    (spaces, then the right answer) does not pass, in any language."""
    pad = 2**20 + 10
    python = f"print('9' * 100 + ' ' * {pad} + '42')\n"
    cpp = (f"#include <cstdio>\nint main(){{for(int i=0;i<100;i++)putchar('9');for(int i=0;i<{pad};i++)putchar(' ');"
           "puts(\"42\");return 0;}\n")
    for language, program in [("python", python), ("cpp", cpp)]:
        result = run(sandbox, program, [IOTest(stdout="42\n")], language=language)
        assert result.status is Status.runtime_error, (language, result.detail)
        assert result.tests[0].error == "output too long to compare"
    # under the size, the same output is compared as a whole, and so fails as a wrong answer
    short = run(sandbox, "print('9' * 100 + ' ' * 1000 + '42')\n", [IOTest(stdout="42\n")])
    assert short.status is Status.failed


def test_each_case_starts_from_a_fresh_program(sandbox):
    counter = "import sys\ncount = 0\ndef step():\n    global count\n    count += 1\n    return count\n" \
              "step()\nprint(count + int(input()))\n"
    cases = [IOTest(stdin=f"{i}\n", stdout=f"{i + 1}\n") for i in range(5)]
    assert run(sandbox, counter, cases).status is Status.passed  # no state carried from case to case


def test_output_match_rules(sandbox):
    floats = "print(f'{1/3:.9f}')\n"
    assert run(sandbox, floats, [IOTest(stdout="0.333333333")]).status is Status.passed
    assert run(sandbox, floats, [IOTest(stdout="0.3333334")]).status is Status.passed  # within 1e-6
    assert run(sandbox, floats, [IOTest(stdout="0.3333334")],
               match=OutputMatch(float_tolerance=None)).status is Status.failed
    spaced = "print('1  2 ')\nprint()\n"
    assert run(sandbox, spaced, [IOTest(stdout="1 2")]).status is Status.passed
    assert run(sandbox, spaced, [IOTest(stdout="1 2")], match=OutputMatch(mode="lines")).status is Status.failed
    assert run(sandbox, spaced, [IOTest(stdout="1  2")], match=OutputMatch(mode="lines")).status is Status.passed
    assert run(sandbox, spaced, [IOTest(stdout="1  2 \n\n")], match=OutputMatch(mode="exact")).status is Status.passed
    # as the contests' checkers: tokens split at ASCII whitespace only; a bool result is not a number
    assert run(sandbox, "print('1\u30002')\n", [IOTest(stdout="1 2")]).status is Status.failed
    # nor at the separators Python's str.split splits at, in an ASCII output or not
    for separator in ["\x1c", "\x1d", "\x1e", "\x1f", "\x85"]:
        for printed in [f"1{separator}2", f"1{separator}2 \u00e9"]:
            case = [IOTest(stdout="1 2" + printed[3:])]
            assert run(sandbox, f"print({printed!r})\n", case).status is Status.failed, (separator, printed)
    assert run(sandbox, "print('1\t2')\n", [IOTest(stdout="1 2")]).status is Status.passed
    for program, language in [("def f():\n    return True\n", "python"), ("function f() { return true; }\n", "javascript")]:
        assert run(sandbox, program, [CallTest(args=[], accepted=[1])], language=language, entry_point="f").status is Status.failed
        assert run(sandbox, program, [CallTest(args=[], accepted=[True])], language=language, entry_point="f").status is Status.passed


def test_call_cases(sandbox):
    add = "def add(a, b):\n    return a + b\n"
    cases = [CallTest(args=[1, 2], accepted=[3]), CallTest(args=[0.1, 0.2], accepted=[0.3]),
             CallTest(args=[[1], [2]], accepted=[[1, 2]])]
    assert run(sandbox, add, cases, entry_point="add").status is Status.passed
    wrong = run(sandbox, add.replace("a + b", "a * b"), cases, entry_point="add")
    assert wrong.status is Status.failed and [t.passed for t in wrong.tests] == [False, False, False]
    assert wrong.tests[0].error == "wrong result: 2"
    solution = "class Solution:\n    def twoSum(self, nums, target):\n        seen = {}\n" \
               "        for i, n in enumerate(nums):\n            if target - n in seen:\n" \
               "                return (seen[target - n], i)\n            seen[n] = i\n"
    leetcode = [CallTest(args=[[2, 7, 11, 15], 9], accepted=[[0, 1]]), CallTest(args=[[3, 2, 4], 6], accepted=[[1, 2]])]
    assert run(sandbox, solution, leetcode, entry_point="twoSum").status is Status.passed  # a tuple equals its list
    # APPS accepts its expected list or its first item
    assert run(sandbox, "def f(x):\n    return x\n", [CallTest(args=[5], accepted=[[5], 5])],
               entry_point="f").status is Status.passed
    typed = "class Solution:\n    def add(self, a: int, b: List[int]) -> Optional[int]:\n        return a + sum(b)\n"
    assert run(sandbox, typed, [CallTest(args=[1, [2, 3]], accepted=[6])], entry_point="add").status is Status.passed
    missing = run(sandbox, "x = 1\n", cases[:1], entry_point="add")
    assert missing.status is Status.failed and "neither add nor class Solution" in missing.tests[0].error
    slow = run(sandbox, "import time\ndef add(a, b):\n    if a > 0:\n        time.sleep(30)\n    return a + b\n",
               [CallTest(args=[0, 1], accepted=[1]), CallTest(args=[1, 1], accepted=[2]), CallTest(args=[0, 2], accepted=[2])],
               entry_point="add", case_timeout_s=0.5)
    assert slow.status is Status.timeout and [t.passed for t in slow.tests] == [True, False, False]
    assert slow.tests[1].error == "exceeded the case time limit of 0.5 s"


def test_cpp_cases_follow_the_same_rules(sandbox):
    program = "#include <cstdio>\n#include <unistd.h>\nint main(){long a,b;scanf(\"%ld %ld\",&a,&b);" \
              "if(a>100) sleep(30); printf(\"%ld\\n\",a+b);}\n"
    result = run(sandbox, program, SUM_CASES, language="cpp", case_timeout_s=0.5, wall_timeout_s=30.0)
    assert result.status is Status.timeout, result.detail
    assert [t.passed for t in result.tests] == [True, True, True, False]
    floats = "#include <cstdio>\nint main(){printf(\"%.9f\\n\", 1.0/3);}\n"
    assert run(sandbox, floats, [IOTest(stdout="0.3333334")], language="cpp", wall_timeout_s=30.0).status is Status.passed


JS_SUM = "const [a, b] = require('fs').readFileSync(0, 'utf8').trim().split(/\\s+/).map(Number);\nconsole.log(a + b);\n"


def test_javascript_stdio_cases(sandbox):
    passed = run(sandbox, JS_SUM, SUM_CASES[:3], language="javascript")
    assert passed.status is Status.passed, (passed.detail, passed.stderr[-300:])
    wrong = run(sandbox, JS_SUM.replace("a + b", "a - b"), SUM_CASES[:3], language="javascript")
    assert wrong.status is Status.failed and wrong.detail.startswith("case 0: wrong output")
    broken = run(sandbox, "const x = ;\n", SUM_CASES[:3], language="javascript")
    assert broken.status is Status.syntax_error and "SyntaxError" in broken.detail
    thrown = run(sandbox, "throw new RangeError('not today');\n", SUM_CASES[:1], language="javascript")
    assert thrown.status is Status.runtime_error and "RangeError: not today" in thrown.tests[0].error


def test_javascript_call_cases(sandbox):
    add = "function add(a, b) {\n  console.log('the program may print');\n  return a + b;\n}\n"
    cases = [CallTest(args=[1, 2], accepted=[3]), CallTest(args=[0.1, 0.2], accepted=[0.3])]
    assert run(sandbox, add, cases, language="javascript", entry_point="add").status is Status.passed
    wrong = run(sandbox, add.replace("a + b", "a * b"), cases, language="javascript", entry_point="add")
    assert wrong.status is Status.failed and wrong.tests[0].error == "wrong result: 2"
    solution = "class Solution {\n  twoSum(nums, target) {\n    const seen = new Map();\n" \
               "    for (let i = 0; i < nums.length; i++) {\n      if (seen.has(target - nums[i])) return [seen.get(target - nums[i]), i];\n" \
               "      seen.set(nums[i], i);\n    }\n  }\n}\n"
    leetcode = [CallTest(args=[[2, 7, 11, 15], 9], accepted=[[0, 1]]), CallTest(args=[[3, 2, 4], 6], accepted=[[1, 2]])]
    assert run(sandbox, solution, leetcode, language="javascript", entry_point="twoSum").status is Status.passed
    exported = "module.exports.add = (a, b) => a + b;\n"
    assert run(sandbox, exported, cases[:1], language="javascript", entry_point="add").status is Status.passed
    missing = run(sandbox, "const x = 1;\n", cases[:1], language="javascript", entry_point="add")
    assert missing.status is Status.runtime_error and "neither add nor class Solution" in missing.tests[0].error


def test_requests_are_checked():
    with pytest.raises(ValueError, match="one kind per task"):
        ExecutionRequest(program="", tests=["assert True", IOTest(stdout="1")])
    with pytest.raises(ValueError, match="entry_point"):
        ExecutionRequest(program="", tests=[CallTest(args=[], accepted=[1])])
    with pytest.raises(ValueError, match="Python"):
        ExecutionRequest(program="", tests=["assert True"], language="javascript", entry_point="f")
    with pytest.raises(ValueError, match="not a JavaScript identifier"):
        ExecutionRequest(program="", tests=[CallTest(args=[], accepted=[1])], language="javascript",
                         entry_point="f; process.exit(0)")


@pytest.mark.parametrize("got, expected, mode, tolerance, same", [
    ("3\n", "3", "tokens", 1e-6, True),
    ("1 2\n3", "1\n2 3\n", "tokens", 1e-6, True),
    ("1 2", "1 2 3", "tokens", 1e-6, False),
    ("1000001", "1000000", "tokens", 1e-6, False),  # integers are never matched by tolerance
    ("+7", "7", "tokens", 1e-6, True),
    ("0.30000001", "0.3", "tokens", 1e-6, True),
    ("2.0000021e6", "2.000002e6", "tokens", 1e-6, True),
    ("0.31", "0.3", "tokens", 1e-6, False),
    ("nan", "0.3", "tokens", 1e-6, False),
    ("inf", "inf", "tokens", 1e-6, True),
    ("YES", "yes", "tokens", 1e-6, False),
    ("a  \nb\n\n", "a\nb", "lines", None, True),
    ("a b", "a  b", "lines", None, False),
    ("a\n", "a", "exact", None, False),
    # the contests' checkers split at ASCII whitespace only, and read ASCII digits only
    ("1\u30002", "1 2", "tokens", 1e-6, False),
    ("1\u00a02", "1 2", "tokens", 1e-6, False),
    *[(f"1{c}2", "1 2", "tokens", 1e-6, False) for c in "\x1c\x1d\x1e\x1f\x85"],
    *[(f"1{c}2 \u00e9", "1 2 \u00e9", "tokens", 1e-6, False) for c in "\x1c\x1d\x1e\x1f\x85"],
    ("1\t2\r\n", "1 2", "tokens", 1e-6, True),
    ("\uff11\uff12", "12", "tokens", 1e-6, False),  # fullwidth digits: int() reads them as 12
    ("1_000", "1000", "tokens", 1e-6, False),
    ("0.3\u00a0", "0.3", "lines", None, False),
])
def test_outputs_match(got, expected, mode, tolerance, same):
    assert outputs_match(got, expected, mode, tolerance) is same


@pytest.mark.parametrize("got, expected, same", [
    ((1, 2), [1, 2], True),
    ([(1, 2)], [[1, 2]], True),
    (0.1 + 0.2, 0.3, True),
    (1, 1.0000001, True),
    (1, 2, False),
    ({"a": 1.0}, {"a": 1}, True),
    ({"a": 1}, {"b": 1}, False),
    ("1", 1, False),
    ([1, 2], [1, 2, 3], False),
    (None, None, True),
    # JSON's true is not 1: a bool matches only a bool, also inside a list or an object
    (True, 1, False),
    (1, True, False),
    (False, 0, False),
    (0.0, False, False),
    ([True], [1], False),
    ({"ok": 1}, {"ok": True}, False),
    (True, True, True),
])
def test_values_match(got, expected, same):
    assert values_match(got, expected) is same
