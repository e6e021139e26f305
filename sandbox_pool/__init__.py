"""Executing untrusted programs: typed requests and results, the process backend, the Ray pool."""
from sandbox_pool.pool import PoolSettings, SandboxPool
from sandbox_pool.process_backend import ForkServer
from sandbox_pool.results import CallTest, ExecutionRequest, ExecutionResult, IOTest, Limits, OutputMatch, Status, TestOutcome

__all__ = [
    "ExecutionRequest",
    "ExecutionResult",
    "ForkServer",
    "CallTest",
    "IOTest",
    "OutputMatch",
    "Limits",
    "PoolSettings",
    "SandboxPool",
    "Status",
    "TestOutcome",
]
