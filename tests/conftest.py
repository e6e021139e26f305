"""Shared fixtures: one local Ray cluster and one tiny model for the whole test session; the tiers.

Two tiers: a test that starts Ray, vLLM, DeepSpeed, Serve or Docker containers is `slow` (by its
`ray_cluster` fixture, a "docker" parameter or tests/test_sandbox_docker.py); the rest is the fast
tier (`make test-fast`, `-m "not slow"`). With CODERLOO_FAST_TIER=1 starting Ray, vLLM, DeepSpeed or
Serve raises, so a test in the wrong tier fails there.
"""
from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHARED_DATA = ROOT.parent / "shared" / "data"

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

# module -> what starts the part: the names a fast-tier test must not call
HEAVY = {"ray": ["init"], "ray.serve": ["start", "run"], "deepspeed": ["initialize"], "vllm": ["LLM"]}


def pytest_collection_modifyitems(items):
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        docker = "docker" in params.values() or item.module.__name__.endswith("test_sandbox_docker")
        if "ray_cluster" in item.fixturenames or docker:
            item.add_marker(pytest.mark.slow)


class _RefuseHeavy(importlib.abc.MetaPathFinder):
    """Replaces the starters in HEAVY with a refusal as each module is imported."""

    def find_spec(self, name, path=None, target=None):
        if name not in HEAVY:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_refuse(module):
            exec_module(module)
            for attr in HEAVY[name]:
                setattr(module, attr, _refusal(f"{name}.{attr}"))

        spec.loader.exec_module = exec_and_refuse
        return spec


def _refusal(what: str):
    def refuse(*args, **kwargs):
        raise RuntimeError(f"{what} in the fast tier: mark the test slow (tests/conftest.py)")
    return refuse


if os.environ.get("CODERLOO_FAST_TIER") == "1":
    assert not set(HEAVY) & set(sys.modules), "conftest must refuse the heavy parts before they are imported"
    sys.meta_path.insert(0, _RefuseHeavy())


@pytest.fixture(scope="session")
def ray_cluster():
    """A local Ray instance on loopback shared by every test that needs Ray."""
    from coderloo.runtime import init_ray

    import ray

    init_ray(num_cpus=4)  # with the `sandbox` resource for the sandbox pool
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        raise FileNotFoundError(f"benchmark data not found at {SHARED_DATA}")
    return SHARED_DATA


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    """One tiny Qwen2 model (tied embeddings) and tokenizer, built offline, for every test."""
    from coderloo.models import TinyModelSpec, build_tiny_model
    from coderloo.tasksets.synthetic import corpus_for_tokenizer

    return build_tiny_model(tmp_path_factory.mktemp("tiny-qwen2"), corpus_for_tokenizer(), TinyModelSpec())


@pytest.fixture(scope="module", params=["process", "docker"])
def sandbox(request):
    """(backend, run): each sandbox backend in turn, and `run(requests)` -> their results, all on
    one event loop per module (the Docker backend replaces a recycled container in a task of the
    loop that ran the request, which must still be running for the next request). The Docker half
    skips without an engine, or fails where CODERLOO_REQUIRE_DOCKER=1."""
    import asyncio

    from sandbox_pool import ForkServer
    from tests.test_sandbox_docker import docker_backend_or_skip

    loop = asyncio.new_event_loop()
    backend = ForkServer() if request.param == "process" else docker_backend_or_skip(containers=2)

    def run(requests):
        async def go():
            return await asyncio.gather(*(backend.execute(r) for r in requests))

        return loop.run_until_complete(go())

    yield backend, run
    backend.close()
    loop.close()
