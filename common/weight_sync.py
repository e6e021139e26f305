"""Weight sync from learner rank 0 into the rollout engines: one broadcast group, parameters in buckets.

Two transports, one protocol:

- "gloo": torch.distributed's CPU backend over TCP (one machine or several); the receiver hands
  the tensors to the engine's own weight loader (vLLM's in-place reload, which repacks weights
  for the CPU kernels), bucket by bucket as they arrive.
- "nccl": the same broadcasts into the GPU memory of the vLLM workers (the receiving side runs
  inside the vLLM worker process, through vLLM's worker extension and `collective_rpc`).

The sender (learner rank 0) hosts a TCPStore; every engine joins as rank 1..N. A push sends the
buckets of a `BucketPlan` in order, each one flat buffer of one dtype, then a trailer: the float64
sum of every bucket and of a few probe parameters. Each receiver checks the sums of what it got
against the trailer, and the probe parameters read back from its engine after loading, before it
takes on the new version (`verify`). Every collective has a timeout: a peer that died or never
joined raises an error that says so, rather than hanging the run.

A push is of one form (`BucketPlan.form`): "weights", the whole model as the engine serves it;
"adapter", only a LoRA adapter's tensors under PEFT's names with its adapter_config, which the
engine serves on the base model it holds (its probe: the sum of every lora_A matrix as the engine
holds them, ADAPTER_PROBE); "base", the whole model under the adapter, without it (an engine that
starts from other weights than the learner's base gets it before the adapter). A source's
`sync_forms` say which pushes bring a new engine up to date; the last is each step's push.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import timedelta

import torch

# Parameters read back from the engine after every update: embeddings and norms are stored as
# sent (linear layers are repacked by CPU kernels, so their sums are not comparable).
PROBE_NAMES = ("model.embed_tokens.weight", "model.norm.weight")
# An adapter push's probe: the sum of all of its lora_A matrices (engines keep them as sent; vLLM
# scales lora_B by alpha / r and packs q, k, v together, which leaves that sum alone).
ADAPTER_PROBE = "*.lora_A"
FORMS = ("weights", "base", "adapter")


class WeightSyncError(RuntimeError):
    """A weight update did not arrive whole: the engine does not hold the weights that were sent."""


class WeightSyncTimeout(WeightSyncError):
    """A peer of the weight-sync group did not answer in time (dead, hung or never joined)."""


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    dtype: str  # torch dtype name without the "torch." prefix

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)


@dataclass(frozen=True)
class BucketPlan:
    """The order and grouping of the tensors of one push; fixed for a model, computed once."""

    buckets: tuple[tuple[TensorSpec, ...], ...]
    probes: tuple[str, ...]  # names from PROBE_NAMES that the model has, or ADAPTER_PROBE
    adapter: dict | None = None  # an adapter push: its adapter_config.json (PEFT's); None: whole weights
    form: str = "weights"  # "weights", "base" or "adapter" (module docstring)

    @property
    def nbytes(self) -> int:
        return sum(s.numel * s.torch_dtype.itemsize for b in self.buckets for s in b)


def plan_buckets(named: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int, adapter: dict | None = None,
                 form: str = "weights") -> BucketPlan:
    """Group tensors, in order, into buckets of one dtype and at most `bucket_bytes` each.

    A tensor larger than `bucket_bytes` travels alone in its own bucket. `adapter`: the tensors are
    a LoRA adapter with this adapter_config (form "adapter"); `form` "base": whole weights under one.
    """
    if (adapter is not None) != (form == "adapter") or form not in FORMS:
        raise ValueError(f"a push of form {form!r} {'with' if adapter is not None else 'without'} an adapter_config")
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be positive, got {bucket_bytes}")
    buckets: list[list[TensorSpec]] = []
    size = 0
    names = []
    for name, tensor in named:
        spec = TensorSpec(name, tuple(tensor.shape), str(tensor.dtype).removeprefix("torch."))
        nbytes = spec.numel * tensor.element_size()
        same_dtype = bool(buckets) and buckets[-1][0].dtype == spec.dtype
        if not buckets or not same_dtype or size + nbytes > bucket_bytes:
            buckets.append([])
            size = 0
        buckets[-1].append(spec)
        size += nbytes
        names.append(name)
    if len(set(names)) != len(names):
        raise ValueError("tensor names must be unique within a push")
    if adapter is not None:
        if not any(is_lora_a(n) for n in names):
            raise ValueError("an adapter push without lora_A tensors")
        return BucketPlan(tuple(tuple(b) for b in buckets), (ADAPTER_PROBE,), adapter, form)
    probes = tuple(p for p in PROBE_NAMES if p in names)
    return BucketPlan(tuple(tuple(b) for b in buckets), probes, None, form)


def is_lora_a(name: str) -> bool:
    return ".lora_A." in name


def probe_sums(named: Mapping[str, torch.Tensor], probes: Iterable[str]) -> dict[str, float]:
    """The float64 sum of each probe: a named tensor, or ADAPTER_PROBE (every lora_A of `named`;
    PEFT's names with or without the adapter's own name). A probe `named` lacks is left out."""
    sums = {}
    for probe in probes:
        if probe == ADAPTER_PROBE:
            tensors = [t for n, t in named.items() if is_lora_a(n)]
            if tensors:
                sums[probe] = float(sum(t.detach().double().sum() for t in tensors))
        elif probe in named:
            sums[probe] = float(named[probe].detach().double().sum())
    return sums


def open_group(backend: str, host: str, port: int, rank: int, world_size: int, timeout_s: float):
    """Join (rank 0: host) a process group of its own, beside any default torch.distributed group.

    Blocks until all `world_size` ranks have joined, or raises after `timeout_s`.
    """
    import torch.distributed as dist

    timeout = timedelta(seconds=timeout_s)
    store = dist.TCPStore(host, port, world_size, is_master=rank == 0, timeout=timeout, wait_for_workers=False)
    store = dist.PrefixStore("coderloo-weights", store)
    if backend == "gloo":
        opts = dist.ProcessGroupGloo._Options()
        opts._timeout = timeout
        opts._devices = [dist.ProcessGroupGloo.create_device(hostname=host if rank == 0 else _own_address(host))]
        return dist.ProcessGroupGloo(store, rank, world_size, opts)
    if backend == "nccl":
        opts = dist.ProcessGroupNCCL.Options()
        opts._timeout = timeout
        return dist.ProcessGroupNCCL(store, rank, world_size, opts)
    raise ValueError(f"unknown weight-sync transport {backend!r}: expected 'gloo' or 'nccl'")


def _own_address(peer: str) -> str:
    """This machine's address on the route to `peer` (loopback when the peer is loopback)."""
    import socket

    if peer.startswith("127."):
        return "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((peer, 9))  # UDP connect sends nothing; it only picks the route
        return s.getsockname()[0]


def _broadcast(group, tensor: torch.Tensor) -> None:
    import torch.distributed as dist

    opts = dist.BroadcastOptions()
    opts.rootRank = 0
    try:
        group.broadcast([tensor], opts).wait()
    except RuntimeError as e:
        raise WeightSyncTimeout(f"weight broadcast failed (a peer died, hung or left the group): {e}") from e


def send(group, plan: BucketPlan, named: Mapping[str, torch.Tensor], device: torch.device | str) -> dict:
    """Rank 0: broadcast every bucket of `plan`, then the trailer of checksums."""
    sums = []
    for bucket in plan.buckets:
        buf = torch.cat([named[s.name].detach().reshape(-1).to(device=device, dtype=s.torch_dtype) for s in bucket])
        sums.append(buf.double().sum())
        _broadcast(group, buf)
    probes = probe_sums(named, plan.probes)
    _broadcast(group, torch.tensor([float(x) for x in sums] + [probes[p] for p in plan.probes], dtype=torch.float64, device=device))
    return {"bytes": plan.nbytes}


class WeightSource:
    """Mixin for the actor that owns the weights (the learner's rank 0): the sender's side of
    RolloutGroup.connect/push. Subclasses define `weights_for_sync(form)`, a context manager that
    yields {name: tensor} of the push of that form (ZeRO-3 gathers them there); one with a LoRA
    adapter also `sync_forms` and `adapter_config`."""

    _sync_group = None
    _sync_device = "cpu"

    def weights_for_sync(self, form: str = "weights"):
        raise NotImplementedError

    def sync_forms(self) -> list[str]:
        """The pushes that bring an engine started from the model's path up to date, in order;
        the last one is what each step pushes."""
        return ["weights"]

    def adapter_config(self) -> dict | None:
        """The adapter_config.json of the adapter a push of form "adapter" carries."""
        return None

    def weight_sync_address(self) -> tuple[str, int]:
        """Where receivers reach this actor's store: its node's address and a free port."""
        from common.placement import node_address_and_port

        return node_address_and_port()

    def open_weight_group(self, transport: str, host: str, port: int, world_size: int, timeout_s: float) -> None:
        self._sync_group = open_group(transport, host, port, 0, world_size, timeout_s)
        self._sync_device = "cuda" if transport == "nccl" else "cpu"

    def weight_plans(self, bucket_bytes: int) -> list[BucketPlan]:
        """One plan for each of `sync_forms`. A collective under ZeRO-3 (every rank calls it)."""
        plans = []
        for form in self.sync_forms():
            with self.weights_for_sync(form) as named:
                plans.append(plan_buckets(named.items(), bucket_bytes, self.adapter_config() if form == "adapter" else None, form))
        return plans

    def send_weights(self, plan: BucketPlan, send_them: bool = True) -> dict:
        """Broadcast the push of `plan`; with `send_them` false (learner ranks > 0), only take part
        in gathering it (a collective under ZeRO-3)."""
        with self.weights_for_sync(plan.form) as named:
            if not send_them:
                return {"bytes": 0}
            if self._sync_group is None:
                raise WeightSyncError("no weight-sync group: open it before sending")
            return send(self._sync_group, plan, named, self._sync_device)


class Receiver:
    """Ranks 1..N: `tensors()` yields (name, tensor) as buckets arrive, for the engine's loader.

    After the loader has consumed them, `finish(held_probes)` receives the trailer and raises
    WeightSyncError if any bucket or probe parameter differs from what the sender had.
    """

    def __init__(self, group, plan: BucketPlan, device: torch.device | str):
        self.group, self.plan, self.device = group, plan, device
        self.sums: list[float] = []

    def tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        for bucket in self.plan.buckets:
            numel = sum(s.numel for s in bucket)
            buf = torch.empty(numel, dtype=bucket[0].torch_dtype, device=self.device)
            _broadcast(self.group, buf)
            self.sums.append(float(buf.double().sum()))
            offset = 0
            for spec in bucket:
                yield spec.name, buf[offset : offset + spec.numel].view(spec.shape)
                offset += spec.numel

    def finish(self, read_probes: Callable[[list[str]], dict[str, float]]) -> None:
        if len(self.sums) != len(self.plan.buckets):
            raise WeightSyncError(
                f"the engine's loader consumed {len(self.sums)} of {len(self.plan.buckets)} buckets"
            )
        trailer = torch.empty(len(self.plan.buckets) + len(self.plan.probes), dtype=torch.float64, device=self.device)
        _broadcast(self.group, trailer)
        expected = trailer.cpu().tolist()
        verify(self.plan, self.sums, expected, read_probes(list(self.plan.probes)))


def verify(plan: BucketPlan, received: list[float], trailer: list[float], held: dict[str, float]) -> None:
    """Compare the received bucket sums and the engine's probe parameters with the sender's sums."""

    def close(a: float, b: float) -> bool:
        return abs(a - b) <= 1e-6 * max(1.0, abs(b))

    n = len(plan.buckets)
    for i, (got, sent) in enumerate(zip(received, trailer[:n])):
        if not close(got, sent):
            first = plan.buckets[i][0].name
            raise WeightSyncError(f"bucket {i} (from {first}) arrived with sum {got}, sent with sum {sent}")
    for name, sent in zip(plan.probes, trailer[n:]):
        got = held.get(name)
        if got is None or not close(got, sent):
            raise WeightSyncError(f"after loading, {name} in the engine sums to {got}, sent {sent}")
