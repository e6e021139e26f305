"""Shared fixtures: one local Ray cluster and one tiny model for the whole test session."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHARED_DATA = ROOT.parent / "shared" / "data"

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")


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
