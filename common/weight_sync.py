"""Weight sync from learner rank 0 into the rollout engines: one group, parameters in buckets.

Three transports, one protocol:

- "shm": for an engine on the sender's Ray node. The sender writes the buckets into one file in
  /dev/shm (named per group and push); the engine maps it and hands views of it to its loader, with
  no copy on the way. The file's name goes once every engine has loaded it (or the push failed), but
  both sides keep their mappings: the next push of the same plan is written into the same memory
  (a fresh file's pages, allocated and mapped, cost more than the copy itself), and the memory goes
  with the last process that maps it, so nothing is left behind when one dies.
- "gloo": torch.distributed's CPU backend over TCP (one machine or several); the receiver hands
  the tensors to the engine's own weight loader (vLLM's in-place reload, which repacks weights
  for the CPU kernels), bucket by bucket as they arrive.
- "nccl": the same broadcasts into the GPU memory of the vLLM workers (the receiving side runs
  inside the vLLM worker process, through vLLM's worker extension and `collective_rpc`).
"auto" (the config's default) is shm for an engine on the sender's node and gloo for the others.

The sender (learner rank 0) hosts a TCPStore; every engine joins as rank 1..N and says there which
transport it takes (`open_group`). A push sends the buckets of a `BucketPlan` in order, each one
flat buffer of one dtype, then a trailer: the checksum of every bucket (`bit_sum`: exact).
Shared-memory receivers read each bucket's checksum from the store once it is written. Each
receiver checks the checksums of what it got (so it holds exactly what was sent), sums a few
probe parameters of it as its engine's dtype rounds them (a float32 learner's values in a bf16
engine), and compares those with the same parameters read back from its engine after loading,
before it takes on the new version (`verify`). Every wait has a timeout: a peer that died or
never joined raises an error that says so, rather than hanging the run.

A push is of one form (`BucketPlan.form`): "weights", the whole model as the engine serves it;
"adapter", only a LoRA adapter's tensors under PEFT's names with its adapter_config, which the
engine serves on the base model it holds (its probe: the sum of every lora_A matrix as the engine
holds them, ADAPTER_PROBE); "base", the whole model under the adapter, without it (an engine that
starts from other weights than the learner's base gets it before the adapter). A source's
`sync_forms` say which pushes bring a new engine up to date; the last is each step's push.
"""
from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import timedelta

import torch

# Parameters read back from the engine after every update: embeddings and norms are stored as
# sent (linear layers are repacked by CPU kernels, so their sums are not comparable).
PROBE_NAMES = ("model.embed_tokens.weight", "model.norm.weight")
# An adapter push's probe: the sum of all of its lora_A matrices (engines keep them as sent; vLLM
# scales lora_B by alpha / r and packs q, k, v together, which leaves that sum alone).
ADAPTER_PROBE = "*.lora_A"
FORMS = ("weights", "base", "adapter")
TRANSPORTS = ("auto", "shm", "gloo", "nccl")  # rollout.weight_sync.transport (module docstring)
SHM_DIR = "/dev/shm"
SEGMENT_PREFIX = "coderloo-weights-"  # a push's file: SHM_DIR/SEGMENT_PREFIX<sender pid>-<group token>-<push number>
_ALIGN = 64  # each bucket starts at a multiple of this in a segment (any dtype's view of it is aligned)


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
                sums[probe] = float(sum(float64_sum(t) for t in tensors))
        elif probe in named:
            sums[probe] = float64_sum(named[probe])
    return sums


FLOAT64_CHUNK = 1 << 18  # elements: a chunk's float64 copy (2 MiB) stays in the CPU's cache


def float64_sum(tensor: torch.Tensor) -> float:
    """The sum of `tensor`, accumulated in float64, a chunk at a time: torch sums a float32 or
    bfloat16 tensor into float64 without vectorizing, so each chunk is copied into one float64
    buffer and summed there (several times faster on a CPU for a 0.5B model's embedding; a new
    buffer per chunk costs its page faults in a process whose allocator maps large blocks afresh
    each time, as the learner's did)."""
    return _float64_sums(tensor, None, magnitude=False)[0]


def float64_sums(tensor: torch.Tensor, rounded_to: torch.dtype | None = None) -> tuple[float, float]:
    """The float64 sum of `tensor` and of its magnitudes (the scale of the sum's rounding error),
    its values rounded to `rounded_to` first when given (what an engine of that dtype holds)."""
    return _float64_sums(tensor, rounded_to, magnitude=True)


def _float64_sums(tensor: torch.Tensor, rounded_to: torch.dtype | None, magnitude: bool) -> tuple[float, float]:
    flat = tensor.detach().reshape(-1)
    buffer = torch.empty(min(FLOAT64_CHUNK, flat.numel()), dtype=torch.float64, device=flat.device)
    total = torch.zeros((), dtype=torch.float64, device=flat.device)
    magnitudes = torch.zeros((), dtype=torch.float64, device=flat.device)
    for chunk in flat.split(FLOAT64_CHUNK):
        part = buffer[: chunk.numel()]
        part.copy_(chunk if rounded_to in (None, chunk.dtype) else chunk.to(rounded_to))
        total += part.sum()
        if magnitude:  # only the receiver's expected sums need it (the engine's probe reads the sum alone)
            magnitudes += part.abs().sum()
    return float(total), float(magnitudes)


def bit_sum(buf: torch.Tensor) -> int:
    """A bucket's checksum: the sum of its bytes as little-endian 64-bit words, modulo 2**64 (as a
    signed int64). Exact and independent of the order of the additions (so of threads), and as
    fast as a read of the bytes; any one changed word changes it."""
    flat = buf.detach().reshape(-1).view(torch.uint8)
    whole = flat.numel() // 8 * 8
    total = int(flat[:whole].view(torch.int64).sum()) if whole else 0
    total += int.from_bytes(flat[whole:].cpu().numpy().tobytes(), "little")
    return (total + 2**63) % 2**64 - 2**63


@dataclass
class WeightGroup:
    """One rank's view of a weight-sync group: the store every rank joined, and how each engine
    receives (`transports`, by rank). `broadcast` is the process group of rank 0 and the ranks that
    receive by gloo or nccl (None on a rank outside it, or when every engine takes shm)."""

    store: object
    rank: int
    timeout_s: float
    token: str  # names this group's shared-memory files
    transports: dict[int, str]
    broadcast: object | None
    pushes: int = field(default=0)  # pushes begun in this group: both sides count them alike
    # shm: the segment this side keeps mapped from push to push, the plan it is laid out for, and
    # the push that made it (its file's name, while it has one)
    segment: torch.Tensor | None = field(default=None, repr=False)
    segment_plan: BucketPlan | None = field(default=None, repr=False)
    segment_push: int = -1

    def keep_segment(self, segment: torch.Tensor | None, plan: BucketPlan | None = None, push: int = -1) -> None:
        """Keep `segment` mapped for the next pushes of `plan` (None: unmap the one kept)."""
        self.segment, self.segment_plan, self.segment_push = segment, plan, push

    @property
    def transport(self) -> str:
        return self.transports.get(self.rank, "sender")

    @property
    def shm_ranks(self) -> list[int]:
        return [r for r, t in self.transports.items() if t == "shm"]

    def segment_path(self, push: int) -> str:
        return os.path.join(SHM_DIR, f"{SEGMENT_PREFIX}{self.token}-{push}")

    def wait_get(self, key: str, waiting_for: str) -> bytes:
        try:
            self.store.wait([key], timedelta(seconds=self.timeout_s))
        except RuntimeError as e:  # the store's timeout (DistStoreError), or its host went away
            raise WeightSyncTimeout(f"weight sync: no {waiting_for} within {self.timeout_s:g} s ({' '.join(str(e).split())[:200]})") from e
        return self.store.get(key)


def open_group(transport: str, host: str, port: int, rank: int, world_size: int, timeout_s: float,
               node_id: str | None = None) -> WeightGroup:
    """Join (rank 0: host) a weight-sync group of its own, beside any default torch.distributed group.

    `transport`: one of TRANSPORTS. Rank 0 says its Ray `node_id` in the store; an engine (rank >= 1)
    taking "auto" receives by shm when its `node_id` is the same and by gloo otherwise, and one
    taking "shm" on another node is refused. Blocks until all `world_size` ranks have joined, or
    raises WeightSyncTimeout after `timeout_s`.
    """
    import torch.distributed as dist

    if transport not in TRANSPORTS:
        raise ValueError(f"unknown weight-sync transport {transport!r}: expected one of {', '.join(map(repr, TRANSPORTS))}")
    timeout = timedelta(seconds=timeout_s)
    store = dist.TCPStore(host, port, world_size, is_master=rank == 0, timeout=timeout, wait_for_workers=False)
    store = dist.PrefixStore("coderloo-weights", store)
    if rank == 0:
        sweep_segments()
        store.set("sender", json.dumps({"node": node_id, "token": f"{os.getpid()}-{uuid.uuid4().hex[:16]}"}))
    group = WeightGroup(store, rank, timeout_s, "", {}, None)
    sender = json.loads(group.wait_get("sender", "weight-sync sender (rank 0) in the store"))
    group.token = sender["token"]
    if rank > 0:
        mine = transport
        if transport in ("auto", "shm"):
            same_node = node_id is not None and node_id == sender["node"]
            if transport == "shm" and not same_node:
                why = (f"rollout.weight_sync.transport 'shm': engine rank {rank} is on Ray node {node_id}, the learner's "
                       f"rank 0 on {sender['node']}; shared memory needs one node (use 'auto' or 'gloo')")
                store.set(f"transport/{rank}", "error: " + why)
                raise WeightSyncError(why)
            mine = "shm" if same_node else "gloo"
        store.set(f"transport/{rank}", mine)
    for r in range(1, world_size):
        said = group.wait_get(f"transport/{r}", f"answer from weight-sync rank {r} (it never joined)").decode()
        if said.startswith("error: "):
            raise WeightSyncError(f"weight-sync rank {r} could not join: {said.removeprefix('error: ')}")
        group.transports[r] = said
    members = [0] + [r for r, t in group.transports.items() if t != "shm"]
    if len(members) > 1 and rank in members:
        backend = "nccl" if "nccl" in group.transports.values() else "gloo"
        group.broadcast = _process_group(backend, dist.PrefixStore("broadcast", store), members.index(rank), len(members),
                                         timeout, host if rank == 0 else _own_address(host))
    return group


def _process_group(backend: str, store, rank: int, world_size: int, timeout: timedelta, address: str):
    import torch.distributed as dist

    if backend == "gloo":
        opts = dist.ProcessGroupGloo._Options()
        opts._timeout = timeout
        opts._devices = [dist.ProcessGroupGloo.create_device(hostname=address)]
        return dist.ProcessGroupGloo(store, rank, world_size, opts)
    opts = dist.ProcessGroupNCCL.Options()
    opts._timeout = timeout
    return dist.ProcessGroupNCCL(store, rank, world_size, opts)


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


def segment_layout(plan: BucketPlan) -> tuple[list[int], int]:
    """Where each bucket starts in a push's shared-memory file, and the file's size."""
    offsets, end = [], 0
    for bucket in plan.buckets:
        offsets.append(end)
        nbytes = sum(s.numel for s in bucket) * bucket[0].torch_dtype.itemsize
        end += -(-nbytes // _ALIGN) * _ALIGN
    return offsets, max(end, _ALIGN)


def _bucket_view(segment: torch.Tensor, plan: BucketPlan, offsets: list[int], i: int) -> torch.Tensor:
    bucket = plan.buckets[i]
    dtype = bucket[0].torch_dtype
    nbytes = sum(s.numel for s in bucket) * dtype.itemsize
    return segment[offsets[i] : offsets[i] + nbytes].view(dtype)


def _unpack(bucket: tuple[TensorSpec, ...], buf: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
    """The named tensors of a bucket's flat buffer (views of it)."""
    out, offset = [], 0
    for spec in bucket:
        out.append((spec.name, buf[offset : offset + spec.numel].view(spec.shape)))
        offset += spec.numel
    return out


def sweep_segments() -> list[str]:
    """Unlink the push files of senders that are gone: a sender killed mid-push (SIGKILL, the OOM
    killer) never unlinks its file, which would hold its memory until the machine restarts. Returns
    the names unlinked."""
    swept = []
    for name in os.listdir(SHM_DIR):
        pid = name[len(SEGMENT_PREFIX):].split("-")[0] if name.startswith(SEGMENT_PREFIX) else ""
        if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            _unlink(os.path.join(SHM_DIR, name))
            swept.append(name)
    return swept


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def send(group: WeightGroup, plan: BucketPlan, named: Mapping[str, torch.Tensor], device: torch.device | str) -> dict:
    """Rank 0: every bucket of `plan`, then the trailer of checksums, to every engine: written into
    this push's shared-memory file for the shm ranks (each bucket's checksum goes to the store as
    soon as it is written, so they load while the next is written), broadcast for the others.
    Returns once every shm rank has loaded (and checked) its copy; the file is gone by then.
    Returns the bytes sent and seconds taken: to send them (`sent_s`) and until the shm ranks had loaded them."""
    start = time.perf_counter()
    push = group.pushes
    group.pushes += 1
    shm_ranks = group.shm_ranks
    segment = buf = None
    made = None  # the file this push made, if it made one
    try:
        if shm_ranks:
            offsets, size = segment_layout(plan)
            if group.segment is None or group.segment_plan != plan:
                group.keep_segment(None)
                made = group.segment_path(push)
                fd = os.open(made, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
                try:
                    # The file's pages at once, in the kernel: written through the mapping page by page
                    # instead, a fresh file costs a page fault each (several times the copy for a 0.5B model).
                    os.posix_fallocate(fd, 0, size)
                finally:
                    os.close(fd)
                group.keep_segment(torch.from_file(made, shared=True, size=size, dtype=torch.uint8), plan, push)
            segment = group.segment
            group.store.set(f"{push}/segment", str(group.segment_push))  # which file: this push's, or one kept
        sums = []
        for i, bucket in enumerate(plan.buckets):
            if segment is not None:
                buf = _bucket_view(segment, plan, offsets, i)
                at = 0
                for s in bucket:  # straight from the parameters into the file: one copy
                    buf[at : at + s.numel].copy_(named[s.name].detach().reshape(-1))
                    at += s.numel
            else:
                buf = torch.cat([named[s.name].detach().reshape(-1).to(device=device, dtype=s.torch_dtype) for s in bucket])
            sums.append(bit_sum(buf))
            if segment is not None:
                group.store.set(f"{push}/bucket/{i}", str(sums[-1]))
            if group.broadcast is not None:
                _broadcast(group.broadcast, buf)
        if group.broadcast is not None:
            _broadcast(group.broadcast, torch.tensor(sums, dtype=torch.int64, device=device))
        sent_s = time.perf_counter() - start
        for r in shm_ranks:  # the file stays until each has loaded it (an engine that fails says so at once)
            said = group.wait_get(f"{push}/done/{r}", f"word from weight-sync rank {r} that it loaded push {push} from shared memory")
            if said != b"ok":  # it failed (and says why to its caller) and has dropped its mapping
                group.keep_segment(None)
    except BaseException:
        group.keep_segment(None)  # the next push starts afresh, as the receivers do after a failure
        raise
    finally:
        segment = buf = None  # no reference to the mapping but the group's, not even a traceback's
        if made is not None:
            _unlink(made)  # every engine has it mapped (or failed): the memory lives on in the mappings
    # sent_s: until every byte and checksum was written or broadcast; the rest, waiting for shm engines to load
    return {"bytes": plan.nbytes, "sent_s": sent_s, "loaded_s": time.perf_counter() - start}


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
        import ray

        self._sync_group = open_group(transport, host, port, 0, world_size, timeout_s, ray.get_runtime_context().get_node_id())
        self._sync_device = "cuda" if transport == "nccl" else "cpu"

    def weight_plans(self, bucket_bytes: int) -> list[BucketPlan]:
        """One plan for each of `sync_forms`. A collective under ZeRO-3 (every rank calls it)."""
        plans = []
        for form in self.sync_forms():
            with self.weights_for_sync(form) as named:
                plans.append(plan_buckets(named.items(), bucket_bytes, self.adapter_config() if form == "adapter" else None, form))
        return plans

    def send_weights(self, plan: BucketPlan, send_them: bool = True) -> dict:
        """Send the push of `plan`; with `send_them` false (learner ranks > 0), only take part
        in gathering it (a collective under ZeRO-3)."""
        with self.weights_for_sync(plan.form) as named:
            if not send_them:
                return {"bytes": 0}
            if self._sync_group is None:
                raise WeightSyncError("no weight-sync group: open it before sending")
            return send(self._sync_group, plan, named, self._sync_device)


class Receiver:
    """Ranks 1..N: `tensors()` yields (name, tensor) as buckets arrive, for the engine's loader:
    from the broadcast, or views of the push's shared-memory file (shm: no copy).

    After the loader has consumed them, `finish(read_probes)` takes the trailer and raises
    WeightSyncError if any bucket differs from what the sender had, or any probe parameter read
    back from the engine from what it got, rounded to `dtype` (the engine's). An
    shm receiver must `close()` (after `finish`, or on failure: then the sender hears of it at
    once): it drops its mapping of the file, tells the sender, and the last one removes the file.
    """

    def __init__(self, group: WeightGroup, plan: BucketPlan, device: torch.device | str, dtype: torch.dtype):
        self.group, self.plan, self.device, self.dtype = group, plan, device, dtype
        self.sums: list[int] = []
        # what the engine should hold: per probe, [sum, sum of magnitudes, elements] of what arrived, rounded to dtype
        self.probes: dict[str, list[float]] = {}
        self.shm = group.transport == "shm"
        self.push = group.pushes
        group.pushes += 1
        self._closed = False

    def tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Over shm, every bucket has arrived and its checksum is checked when this returns (the
        call, not the iteration), so a bad push is refused before the loader changes anything;
        a broadcast is checked as it is loaded (the trailer, in `finish`)."""
        return self._noting_probes(self._mapped() if self.shm else self._broadcast_tensors())

    def _noting_probes(self, named: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
        adapter = ADAPTER_PROBE in self.plan.probes
        for name, tensor in named:
            probe = ADAPTER_PROBE if adapter and is_lora_a(name) else name
            if probe in self.plan.probes:
                noted = self.probes.setdefault(probe, [0.0, 0.0, 0])
                for i, value in enumerate((*float64_sums(tensor, rounded_to=self.dtype), tensor.numel())):
                    noted[i] += value
            yield name, tensor

    def _mapped(self) -> list[tuple[str, torch.Tensor]]:
        offsets, size = segment_layout(self.plan)
        group = self.group
        made = int(group.wait_get(f"{self.push}/segment", f"push {self.push} from the sender"))
        if group.segment_push != made or group.segment_plan != self.plan:
            # The sender made a new file: map it (privately: the engine cannot write into the sender's
            # memory; pages it never writes show what the sender writes there next).
            group.keep_segment(None)
            group.keep_segment(torch.from_file(group.segment_path(made), shared=False, size=size, dtype=torch.uint8),
                               self.plan, made)
        out = []
        for i, bucket in enumerate(self.plan.buckets):
            sent = int(group.wait_get(f"{self.push}/bucket/{i}", f"bucket {i} of push {self.push} from the sender"))
            buf = _bucket_view(group.segment, self.plan, offsets, i)
            self.sums.append(bit_sum(buf))
            if self.sums[-1] != sent:
                raise WeightSyncError(f"bucket {i} (from {bucket[0].name}) arrived with checksum {self.sums[-1]}, sent with {sent}")
            out += _unpack(bucket, buf if str(self.device) == "cpu" else buf.to(self.device))
        return out

    def _broadcast_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        for bucket in self.plan.buckets:
            buf = torch.empty(sum(s.numel for s in bucket), dtype=bucket[0].torch_dtype, device=self.device)
            _broadcast(self.group.broadcast, buf)
            self.sums.append(bit_sum(buf))
            yield from _unpack(bucket, buf)

    def finish(self, read_probes: Callable[[list[str]], dict[str, float]]) -> None:
        if len(self.sums) != len(self.plan.buckets):
            raise WeightSyncError(
                f"the engine's loader consumed {len(self.sums)} of {len(self.plan.buckets)} buckets"
            )
        n = len(self.plan.buckets)
        if self.shm:
            sent = [int(self.group.store.get(f"{self.push}/bucket/{i}")) for i in range(n)]
        else:
            trailer = torch.empty(n, dtype=torch.int64, device=self.device)
            _broadcast(self.group.broadcast, trailer)
            sent = trailer.cpu().tolist()
        verify(self.plan, self.sums, sent, self.probes, read_probes(list(self.plan.probes)))

    def close(self, error: BaseException | None = None) -> None:
        """Shared memory only (else nothing to do): tell the sender this push is loaded (or why
        not), and remove the file if this is the last engine to have mapped it. The mapping stays
        for the next push, unless this one failed."""
        if not self.shm or self._closed:
            return
        self._closed = True
        group = self.group
        if error is not None:
            group.keep_segment(None)
        store = group.store
        # After a timeout the sender's own removal may never come (it died): this engine removes the file.
        last = isinstance(error, WeightSyncTimeout)
        try:
            store.set(f"{self.push}/done/{group.rank}", "ok" if error is None else f"{type(error).__name__}: {error}"[:500])
            last = store.add(f"{self.push}/closed", 1) == len(group.shm_ranks) or last
        except RuntimeError:  # the store went with the sender, which hosted it
            last = True
        if last:
            _unlink(group.segment_path(self.push))

    def __enter__(self) -> "Receiver":
        return self

    def __exit__(self, kind, error, trace) -> None:
        self.close(error)


def verify(plan: BucketPlan, received: list[int], sent: list[int], expected: dict[str, list[float]],
           held: dict[str, float]) -> None:
    """Compare the received bucket checksums with the sent ones (exactly), and the probe sums of
    what the engine holds after loading with those of what it was given, rounded to its dtype
    (`expected`: sum, sum of magnitudes, elements). Both are float64 sums of the same n values,
    each in its own order: each is within (n - 1) * 2**-53 * (sum of magnitudes) of the exact sum."""
    for i, (got, was) in enumerate(zip(received, sent)):
        if got != was:
            first = plan.buckets[i][0].name
            raise WeightSyncError(f"bucket {i} (from {first}) arrived with sum {got}, sent with sum {was}")
    for name in plan.probes:
        got = held.get(name)
        if name not in expected:
            raise WeightSyncError(f"the engine's loader never took {name} from the push")
        should, magnitude, n = expected[name]
        if got is None or abs(got - should) > 2 * n * 2.0**-53 * magnitude:
            raise WeightSyncError(f"after loading, {name} in the engine sums to {got}; what it was sent, rounded to "
                                  f"its dtype, sums to {should}")
