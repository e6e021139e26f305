"""The bounds that keep the driver and the sandbox light (DESIGN.md, "Weight"): radon's size and
complexity of every function, checked on this tree, and shown to fail on a function past them."""
import sys
from pathlib import Path

from radon.complexity import cc_rank
from radon.visitors import ComplexityVisitor

ROOT = Path(__file__).resolve().parent.parent


def functions(path: Path):
    """(name, lines, radon grade) of every function and method in the file."""
    visitor = ComplexityVisitor.from_code(path.read_text())
    for item in [*visitor.functions, *(m for c in visitor.classes for m in c.methods)]:
        yield f"{path.relative_to(ROOT)}:{item.fullname}", item.endline - item.lineno + 1, cc_rank(item.complexity)


def over(package: str, max_lines: int, worst: str) -> list[str]:
    return [f"{name}: {lines} lines, grade {grade}" for path in sorted((ROOT / package).rglob("*.py"))
            for name, lines, grade in functions(path) if lines > max_lines or grade > worst]


def test_the_driver_is_small_functions():
    assert over("coderloo", max_lines=60, worst="C") == []


def test_the_sandbox_has_no_e_or_f_function_and_its_supervisor_is_small():
    assert over("sandbox_pool", max_lines=10**6, worst="D") == []
    supervisor = ROOT / "sandbox_pool" / "supervisor.py"
    assert len(supervisor.read_text().splitlines()) <= 800
    assert [name for name, lines, _ in functions(supervisor) if lines > 50] == []


def test_a_long_branchy_function_is_found(tmp_path, monkeypatch):
    package = tmp_path / "pkg"
    package.mkdir()
    branches = "".join(f"    if x == {i}:\n        return {i}\n" for i in range(25))
    (package / "m.py").write_text(f"def f(x):\n{branches}    return -1\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert over("pkg", max_lines=60, worst="C") == ["pkg/m.py:f: 52 lines, grade D"]
