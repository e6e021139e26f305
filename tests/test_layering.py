"""The layering contract (pyproject.toml, import-linter): driver -> components -> base package.
It holds on this tree, and it fails on a copy of the tree where a component imports the driver."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ["coderloo", "learner", "rollout_workers", "reward_service", "sandbox_pool", "common"]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def lint_imports(root: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run([str(LINT_IMPORTS), "--no-cache"], cwd=root, env=env, capture_output=True, text=True, timeout=300)


def test_the_tree_keeps_the_layers():
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 kept, 0 broken" in result.stdout


def test_a_component_importing_the_driver_breaks_the_contract(tmp_path):
    for package in PACKAGES:
        shutil.copytree(ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    (tmp_path / "learner" / "bad.py").write_text("from coderloo.config import Config\n")
    result = lint_imports(tmp_path)
    assert result.returncode != 0
    assert "learner.bad -> coderloo.config" in result.stdout, result.stdout
