"""Executing untrusted programs: typed requests and results, the process backend, the Ray pool."""
from sandbox_pool.pool import PoolSettings, SandboxExecutor, SandboxPool
from sandbox_pool.process_backend import ForkServer, execute
from sandbox_pool.results import ExecutionRequest, ExecutionResult, IOTest, Limits, Status, TestOutcome

__all__ = [
    "ExecutionRequest",
    "ExecutionResult",
    "ForkServer",
    "IOTest",
    "Limits",
    "PoolSettings",
    "SandboxExecutor",
    "SandboxPool",
    "Status",
    "TestOutcome",
    "execute",
]
