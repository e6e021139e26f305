"""The rollout workers as one group: least-loaded dispatch of prompts, and versioned weight pushes."""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import ray

from rollout_workers.types import GenerationParams, PromptRollout
from rollout_workers.weight_sync import WeightSyncError, WeightSyncTimeout


@dataclass(frozen=True)
class SyncSettings:
    transport: str = "gloo"  # "gloo" (CPU, TCP) or "nccl" (GPU)
    bucket_bytes: int = 32 << 20
    timeout_s: float = 120.0


class RolloutGroup:
    """Rollout worker actors behind one interface.

    `submit` splits a step's prompts into one chunk per worker and sends each chunk to the worker
    with the fewest prompts in flight, all at once (each engine batches its chunk continuously).
    `push` broadcasts the sender's weights into every engine under a new, increasing version.

    The weight sources are actors with the methods of `WeightSource` (the learner's ranks): the
    first one sends; the others only take part in gathering the weights (ZeRO-3).
    """

    def __init__(self, workers: list, sync: SyncSettings | None = None):
        if not workers:
            raise ValueError("a rollout group needs at least one worker")
        self.workers = list(workers)
        self.sync = sync or SyncSettings()
        self.version = 0
        self._inflight: list[dict[ray.ObjectRef, int]] = [{} for _ in self.workers]
        self._sources: list = []
        self._plan = None
        self._dispatch_lock = threading.Lock()
        self._healthy = True
        self._pids: list[int] = []
        # Pushes and recoveries use the learner's broadcast group: one at a time.
        self._sync_lock = threading.RLock()

    # --- generation ---

    def load(self, index: int) -> int:
        """Prompts in flight on worker `index` (finished requests are dropped from the count)."""
        pending = self._inflight[index]
        for ref in list(pending):
            if _finished(ref):
                del pending[ref]
        return sum(pending.values())

    def _dispatch(self, prompts: list[str], params: GenerationParams, seed: int | None, method: str) -> list[tuple[int, object]]:
        """One chunk per worker, each to the least-loaded worker: [(offset of the chunk, ref)].
        With `seed`, chunk i is sampled with seed + i, whichever worker takes it."""
        share = -(-len(prompts) // len(self.workers))
        out = []
        with self._dispatch_lock:
            for i, start in enumerate(range(0, len(prompts), share)):
                chunk = prompts[start : start + share]
                index = min(range(len(self.workers)), key=self.load)
                chunk_seed = None if seed is None else seed + i
                if method == "generate_stream":
                    call = self.workers[index].generate_stream.options(num_returns="streaming")
                    ref = call.remote(chunk, params, chunk_seed, self.version)
                else:
                    ref = self.workers[index].generate.remote(chunk, params, chunk_seed)
                self._inflight[index][ref] = len(chunk)
                out.append((start, ref))
        return out

    def submit(self, prompts: list[str], params: GenerationParams, seed: int | None = None) -> list[ray.ObjectRef]:
        """Start generation for `prompts`; one ref per chunk, in prompt order."""
        return [ref for _, ref in self._dispatch(prompts, params, seed, "generate")]

    def stream(self, prompts: list[str], params: GenerationParams, seed: int | None = None) -> list[tuple[int, object]]:
        """Start generation for `prompts`: [(offset of a chunk, a generator of refs to
        (index within the chunk, PromptRollout) in the order the groups finish)]."""
        return self._dispatch(prompts, params, seed, "generate_stream")

    def generate(self, prompts: list[str], params: GenerationParams, seed: int | None = None) -> list[PromptRollout]:
        return [rollout for chunk in ray.get(self.submit(prompts, params, seed)) for rollout in chunk]

    # --- weights ---

    def connect(self, sources: list) -> None:
        """Form the broadcast group: the first source as rank 0, the workers as ranks 1..N."""
        s = self.sync
        sender = sources[0]
        host, port = ray.get(sender.weight_sync_address.remote())
        world = len(self.workers) + 1
        refs = [sender.open_weight_group.remote(s.transport, host, port, world, s.timeout_s)]
        refs += [w.join_weight_group.remote(s.transport, host, port, i + 1, world, s.timeout_s) for i, w in enumerate(self.workers)]
        self._wait(refs, "joining the weight-sync group")
        self._plan = ray.get([source.weight_plan.remote(s.bucket_bytes) for source in sources])[0]
        self._sources = list(sources)
        self._pids = ray.get([w.pid.remote() for w in self.workers])
        self._healthy = True

    def recover(self) -> None:
        """After a worker died: wait until every worker answers again (Ray restarts them), then
        form the broadcast group anew and push the current weights as a new version.

        Safe to call from several threads; once the group is whole again, later calls return.
        """
        with self._sync_lock:
            deadline = time.time() + self.sync.timeout_s
            pids = None
            while pids is None:
                try:
                    pids = ray.get([w.pid.remote() for w in self.workers], timeout=self.sync.timeout_s)
                except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                    if time.time() > deadline:
                        raise WeightSyncTimeout(f"rollout workers did not come back within {self.sync.timeout_s:.0f} s") from None
                    time.sleep(1.0)
            if pids == self._pids and self._healthy:
                return  # another thread has recovered already
            self.connect(self._sources)
            if self.version:
                self._push()  # the current weights, under a new version (versions only increase)

    def push(self) -> dict[str, float]:
        """Send the sender's current weights to every worker as version `self.version + 1`.

        Returns the push's timing. Raises WeightSyncError if any worker did not receive the whole
        update, WeightSyncTimeout if a peer did not answer within the timeout.
        """
        with self._sync_lock:
            try:
                return self._push()
            except WeightSyncError:
                self._healthy = False
                raise

    def _push(self) -> dict[str, float]:
        if not self._sources:
            raise WeightSyncError("connect() the group to a weight source before pushing weights")
        version = self.version + 1
        start = time.perf_counter()
        gathers = [source.send_weights.remote(self._plan, False) for source in self._sources[1:]]
        refs = [self._sources[0].send_weights.remote(self._plan)]
        refs += [w.receive_weights.remote(self._plan, version) for w in self.workers]
        results = self._wait(refs, f"pushing weights version {version}")
        ray.get(gathers)
        self.version = version
        return {"sync_s": time.perf_counter() - start, "sync_bytes": results[0]["bytes"]}

    def _wait(self, refs: list, what: str) -> list:
        # Each collective has the group's timeout; this bound only catches a peer that hangs
        # outside a collective (or a Ray call that never starts).
        _, pending = ray.wait(refs, num_returns=len(refs), timeout=self.sync.timeout_s + 30)
        names = ["sender"] + [f"worker {i}" for i in range(len(self.workers))]
        if pending:
            late = [names[refs.index(r)] for r in pending]
            raise WeightSyncTimeout(f"{what}: no answer from {', '.join(late)} within {self.sync.timeout_s + 30:.0f} s")
        results, errors, kind = [], [], WeightSyncError
        for name, ref in zip(names, refs):
            try:
                results.append(ray.get(ref))
            except ray.exceptions.RayTaskError as e:
                if isinstance(e.cause, WeightSyncTimeout) and not errors:
                    kind = WeightSyncTimeout
                errors.append(f"{name}: {type(e.cause).__name__}: {e.cause}")
            except ray.exceptions.RayActorError as e:
                kind = WeightSyncError
                errors.insert(0, f"{name} died: {e}")
        if errors:
            raise kind(f"{what}: " + "; ".join(errors))
        return results


def _finished(ref) -> bool:
    if isinstance(ref, ray.ObjectRef):
        return not ray.wait([ref], timeout=0, fetch_local=False)[1]
    return ref.is_finished() if hasattr(ref, "is_finished") else False
