"""The rollout workers as one group: least-loaded dispatch of prompts, and versioned weight pushes."""
from __future__ import annotations

import threading
import time
from collections.abc import Callable

import ray

from common.weight_sync import WeightSyncError, WeightSyncTimeout
from rollout_workers.config import WeightSyncConfig
from rollout_workers.types import GenerationParams, Prompt, PromptRollout
from rollout_workers.worker import IN_FLIGHT, SIDE_BY_SIDE, StaleWeightsError


class RolloutGroup:
    """Rollout worker actors behind one interface.

    `generate_each` splits a step's prompts into one chunk per worker and sends each chunk to the
    worker with the fewest prompts in flight, all at once (each engine batches its chunk
    continuously), and hands each prompt's samples on as soon as they are finished. A worker that
    dies meanwhile, or is stuck (hands over nothing for `stuck_timeout_s`: it is killed), is
    survived here, and only here: Ray restarts it, `recover` brings it back with the current
    weights, and what it had not finished is generated again.
    `push` broadcasts the sender's weights into every engine under a new, increasing version.

    The weight sources are actors with the methods of `WeightSource` (the learner's ranks): the
    first one sends; the others only take part in gathering the weights (ZeRO-3).

    `in_flight`: the workers were started with update_in_flight (start_workers), and a push reaches
    them while they generate; otherwise it waits for the generation they are running to end.
    `side_by_side` (with `in_flight`): generation calls run at once in each engine, their requests
    in one batch (partial rollouts); otherwise each waits for the one before it.
    """

    def __init__(self, workers: list, sync: WeightSyncConfig | None = None, stuck_timeout_s: float = 600.0, in_flight: bool = False,
                 side_by_side: bool = False):
        if not workers:
            raise ValueError("a rollout group needs at least one worker")
        if side_by_side and not in_flight:
            raise ValueError("side-by-side generation needs workers that take updates in flight (InFlightRolloutWorker)")
        self.in_flight, self.side_by_side = in_flight, side_by_side
        self.workers = list(workers)
        self.sync = sync or WeightSyncConfig()
        self.stuck_timeout_s = stuck_timeout_s
        self.stuck = 0  # workers killed for handing nothing over within stuck_timeout_s
        self.version = 0
        self._inflight: list[dict[ray.ObjectRef, int]] = [{} for _ in self.workers]
        self._sources: list = []
        self._plans: list = []  # the source's pushes that bring a new engine up to date; the last is each step's
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

    def stream(self, prompts: list[Prompt], params: GenerationParams, seed: int | None = None) -> list[tuple[int, int, object]]:
        """Start generation for `prompts`, one chunk per worker, each to the least-loaded worker:
        [(offset of the chunk, the worker's index, a generator of refs to (index within the chunk,
        PromptRollout) in the order the prompts finish)]. With `seed`, chunk i is sampled with
        seed + i, whichever worker takes it."""
        share = -(-len(prompts) // len(self.workers))
        out = []
        with self._dispatch_lock:
            for i, start in enumerate(range(0, len(prompts), share)):
                chunk = prompts[start : start + share]
                index = min(range(len(self.workers)), key=self.load)
                call = self.workers[index].generate_stream.options(
                    num_returns="streaming", **({"concurrency_group": SIDE_BY_SIDE} if self.side_by_side else {}))
                ref = call.remote(chunk, params, None if seed is None else seed + i, self.version, self.stuck_timeout_s / 4)
                self._inflight[index][ref] = len(chunk)
                out.append((start, index, ref))
        return out

    def generate_each(self, prompts: list[Prompt], params: GenerationParams, seed: int | None,
                      done: Callable[[int, PromptRollout], None]) -> int:
        """Generate for `prompts`, calling `done(index, rollout)` (from a thread of this group) as
        each prompt's samples finish. Returns how many times a worker died and the prompts it
        had not finished were generated again (with another seed: a redo draws other samples
        than the lost ones, reproducibly)."""
        finished: set[int] = set()
        errors: list[BaseException] = []
        redos = 0

        def consume(indices: list[int], worker: int, generator) -> None:
            try:
                while True:
                    # a worker that hands nothing over (no finished prompt, no heartbeat) for
                    # stuck_timeout_s is stuck: killed, it is a death
                    if not ray.wait([generator], timeout=self.stuck_timeout_s)[0]:
                        self.stuck += 1
                        ray.kill(self.workers[worker], no_restart=False)  # Ray restarts it
                    try:
                        ref = next(generator)
                    except StopIteration:
                        return
                    item = ray.get(ref)
                    if item is None:  # a heartbeat: the engine is stepping, no prompt finished yet
                        continue
                    local, rollout = item
                    done(indices[local], rollout)
                    finished.add(indices[local])
            except ray.exceptions.RayActorError:
                pass  # the worker died: what did not arrive is generated again
            except ray.exceptions.RayTaskError as e:
                if not isinstance(e.cause, StaleWeightsError):  # else Ray restarted it with initial weights
                    errors.append(e)
            except BaseException as e:
                errors.append(e)

        todo = list(range(len(prompts)))
        while todo:
            redo_seed = None if seed is None else seed + 7919 * redos
            consumers = [
                threading.Thread(target=consume, args=(todo[offset:], worker, generator), daemon=True)
                for offset, worker, generator in self.stream([prompts[i] for i in todo], params, redo_seed)
            ]
            for c in consumers:
                c.start()
            for c in consumers:
                c.join()
            if errors:
                raise errors[0]
            todo = [i for i in todo if i not in finished]
            if todo:  # a worker died: wait for it to come back with the current weights
                redos += 1
                self.recover()
        return redos

    def context_length(self) -> int:
        """The engines' longest prompt + completion, in tokens (the workers share one engine config)."""
        return ray.get(self.workers[0].context_length.remote())

    def generate(self, prompts: list[Prompt], params: GenerationParams, seed: int | None = None) -> list[PromptRollout]:
        """Samples for `prompts`, in order (see `generate_each`)."""
        out: list[PromptRollout | None] = [None] * len(prompts)
        self.generate_each(prompts, params, seed, out.__setitem__)
        return out

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
        self._sources = list(sources)
        self.replan()
        self._pids = [p for p, _ in ray.get([w.status.remote() for w in self.workers])]
        self._healthy = True

    def replan(self) -> None:
        """Ask the sources for their pushes again: after the learner changed what it pushes (a
        LoRA adapter from now on)."""
        with self._sync_lock:
            self._plans = ray.get([source.weight_plans.remote(self.sync.bucket_bytes) for source in self._sources])[0]

    @property
    def _plan(self):
        """What each step pushes."""
        return self._plans[-1] if self._plans else None

    def recover(self) -> None:
        """After a worker died: wait until every worker answers again (Ray restarts them; one that
        does not answer in stuck_timeout_s is killed first), then form the broadcast group anew and
        push the current weights as a new version.

        Safe to call from several threads; once the group is whole again, later calls return.
        """
        with self._sync_lock:
            deadline = time.time() + self.stuck_timeout_s + self.sync.timeout_s  # a stuck one is killed, then restarts
            pids, killed = None, set()
            while pids is None:
                refs = [w.status.remote() for w in self.workers]
                try:
                    pids = [p for p, _ in ray.get(refs, timeout=self.stuck_timeout_s)]
                except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                    if time.time() > deadline:
                        raise WeightSyncTimeout(f"rollout workers did not come back within {self.stuck_timeout_s + self.sync.timeout_s:.0f} s") from None
                    for i, (worker, ref) in enumerate(zip(self.workers, refs)):
                        # not answering: stuck, or restarting (Ray holds calls until it is up). Killed
                        # once (Ray restarts it), then waited for.
                        if i not in killed and not ray.wait([ref], timeout=0)[0]:
                            killed.add(i)
                            self.stuck += 1
                            ray.kill(worker, no_restart=False)
                    time.sleep(1.0)
            if pids == self._pids and self._healthy:
                return  # another thread has recovered already
            self.connect(self._sources)
            if self.version:
                # everything a restarted engine lacks, under a new version (versions only increase)
                self._push(catch_up=True)

    def push(self, catch_up: bool = False) -> dict[str, float]:
        """Send the sender's current weights to every worker as version `self.version + 1`;
        with `catch_up`, first the pushes a new engine needs before them (the base weights under a
        LoRA adapter that did not start from the model's path), taken on with the same version.

        Returns the push's timing. Raises WeightSyncError if any worker did not receive the whole
        update, WeightSyncTimeout if a peer did not answer within the timeout.
        """
        with self._sync_lock:
            try:
                return self._push(catch_up)
            except WeightSyncError:
                self._healthy = False
                raise

    def _push(self, catch_up: bool = False) -> dict[str, float]:
        if not self._sources:
            raise WeightSyncError("connect() the group to a weight source before pushing weights")
        version = self.version + 1
        start = time.perf_counter()
        sent = 0
        for plan in self._plans if catch_up else [self._plan]:
            last = plan is self._plan
            refs = [self._sources[0].send_weights.remote(plan)]
            # an earlier stage is received and checked; the version moves with the last one
            receive = [w.receive_weights.options(concurrency_group=IN_FLIGHT) if self.in_flight else w.receive_weights for w in self.workers]
            refs += [r.remote(plan, version if last else None) for r in receive]
            # the other sources only take part in gathering the weights (ZeRO-3); waited for alike
            refs += [source.send_weights.remote(plan, False) for source in self._sources[1:]]
            results = self._wait(refs, f"pushing weights version {version}" + ("" if last else f" ({plan.form} first)"))
            sent += results[0]["bytes"]
        self.version = version
        return {"sync_s": time.perf_counter() - start, "sync_bytes": sent}

    def _wait(self, refs: list, what: str) -> list:
        # Each collective has the group's timeout; this bound only catches a peer that hangs
        # outside a collective (or a Ray call that never starts).
        _, pending = ray.wait(refs, num_returns=len(refs), timeout=self.sync.timeout_s + 30)
        names = ["sender"] + [f"worker {i}" for i in range(len(self.workers))] + [f"source {i}" for i in range(1, len(self._sources))]
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
