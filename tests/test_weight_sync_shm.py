"""The same-node weight path: a push through a file in /dev/shm into a real vLLM engine. It delivers
the sender's bytes and version, refuses a bad checksum, leaves no file (or mapping) behind after a
push or a failed one, and gloo is what a forced or cross-engine push uses."""
import contextlib
import os

import pytest
import ray
import torch

from common import weight_sync
from common.hf import load_causal_lm
from common.weight_sync import SEGMENT_PREFIX, SHM_DIR, WeightSource, bit_sum, sweep_segments
from learner.actor import named_weights
from rollout_workers import GenerationParams, RolloutGroup, RolloutWorker, WeightSyncError
from rollout_workers.config import WeightSyncConfig
from rollout_workers.vllm_backend import VLLMBackend
from tests.rounding import assert_same_greedy, reference_model

GREEDY = GenerationParams(n=1, max_new_tokens=12, temperature=0.0)


@ray.remote
class ModelSource(WeightSource):
    """The sender, holding a plain model the test changes; `fault` breaks its next sends."""

    def __init__(self, path: str):
        self.model = load_causal_lm(path)
        torch.manual_seed(0)

    @contextlib.contextmanager
    def weights_for_sync(self, form="weights"):
        yield named_weights(self.model)

    def perturb(self, scale: float) -> None:
        with torch.no_grad():
            for p in self.model.parameters():
                p.add_(torch.randn_like(p) * scale)

    def weights(self) -> dict[str, torch.Tensor]:
        return {n: t.clone() for n, t in named_weights(self.model).items()}

    def transports(self) -> tuple[str, dict[int, str]]:
        return self._sync_group.token, dict(self._sync_group.transports)

    def fault(self, kind: str) -> None:
        real = weight_sync.bit_sum
        if kind == "checksum":  # the checksums it sends are off by one: every receiver must refuse the push
            weight_sync.bit_sum = lambda buf: real(buf) + 1
        elif kind == "die":  # dies with its first bucket written to the file, before saying so
            weight_sync.bit_sum = lambda buf: os._exit(1)


@ray.remote
class VLLMEngine:
    """A vLLM engine behind the rollout worker's weight methods, which can also show what it
    holds (its parameters and its process's mappings of weight-sync files) and be told to load a
    push without some of its tensors."""

    def __init__(self, path: str, dtype: str = "float32"):
        self.backend = VLLMBackend(path, dtype=dtype)
        self.version = 0

    def join_weight_group(self, transport, host, port, rank, world_size, timeout_s):
        self.backend.join_weight_group(transport, host, port, rank, world_size, timeout_s, ray.get_runtime_context().get_node_id())

    def receive_weights(self, plan, version):
        self.backend.receive_weights(plan)
        self.version = version
        return version

    def status(self):
        return os.getpid(), self.version

    def parameters(self) -> dict[str, torch.Tensor]:
        def read(worker):
            return {n: p.detach().clone() for n, p in worker.model_runner.model.named_parameters()}

        return self.backend.llm.collective_rpc(read)[0]

    def drop_from_loads(self, names: list[str]) -> None:
        """The engine's loader skips `names` from now on (it keeps its old values of them)."""
        def drop(wrapper):
            worker = getattr(wrapper, "worker", wrapper)  # vLLM hands a wrapper of the worker to an rpc
            load = worker.reload_weights
            worker.reload_weights = lambda weights_iterator, **kw: load(
                weights_iterator=((n, t) for n, t in weights_iterator if n not in names), **kw)

        self.backend.llm.collective_rpc(drop)

    def segment_mappings(self) -> list[str]:
        with open("/proc/self/maps") as maps:
            return [line.strip() for line in maps if SEGMENT_PREFIX in line]


def segments(token: str) -> list[str]:
    return [n for n in os.listdir(SHM_DIR) if n.startswith(f"{SEGMENT_PREFIX}{token}")]


def test_a_dead_senders_push_file_is_swept_and_a_live_ones_kept():
    """A sender killed mid-push never unlinks its file (2.5 GB of memory for the 0.5B model, until
    the machine restarts); a new group's sender unlinks the files of senders that are gone, and
    only those."""
    import subprocess

    dead = subprocess.Popen(["true"])
    dead.wait()
    names = [f"{SEGMENT_PREFIX}{dead.pid}-sweep-test-0", f"{SEGMENT_PREFIX}{os.getpid()}-sweep-test-0"]
    for name in names:
        open(os.path.join(SHM_DIR, name), "wb").close()
    try:
        swept = sweep_segments()
        assert names[0] in swept and names[1] not in swept
        assert [os.path.exists(os.path.join(SHM_DIR, n)) for n in names] == [False, True]
    finally:
        for name in names:
            if os.path.exists(os.path.join(SHM_DIR, name)):
                os.unlink(os.path.join(SHM_DIR, name))


def test_bit_sum_is_exact_and_sees_one_flipped_bit():
    x = torch.randn(1001)  # 4004 bytes: a tail that is not a whole word
    flipped = x.clone()
    flipped.view(torch.int32)[1000] ^= 1
    assert bit_sum(x) == bit_sum(x.clone()) and bit_sum(x) != bit_sum(flipped)
    assert bit_sum(torch.zeros(3, dtype=torch.bfloat16)) == 0


def test_shm_push_delivers_the_senders_bytes_and_version_into_one_kept_segment_without_a_name(ray_cluster, tiny_model):
    """Each push is the sender's bytes; after the first, the file's name is gone, and every push is
    written into the one segment both sides keep mapped (the engine's mapping: of a deleted file)."""
    source = ModelSource.remote(str(tiny_model))
    engine = VLLMEngine.remote(str(tiny_model))
    group = RolloutGroup([engine], WeightSyncConfig(transport="shm", bucket_mb=0.25, timeout_s=60))
    try:
        group.connect([source])
        token, transports = ray.get(source.transports.remote())
        assert transports == {1: "shm"}
        mappings = []
        for version in (1, 2, 3):
            ray.get(source.perturb.remote(0.3))
            timing = group.push()
            assert group.version == version and ray.get(engine.status.remote())[1] == version
            assert timing["sync_bytes"] == group._plan.nbytes
            sent, held = ray.get([source.weights.remote(), engine.parameters.remote()])
            # the parameters vLLM keeps as loaded (the norms; the embedding, its vocabulary padded); its
            # CPU kernels repack the linear layers
            kept = [n for n, t in held.items() if n in sent and sent[n].shape[1:] == t.shape[1:]]
            assert "model.embed_tokens.weight" in kept and len(kept) >= 2 + 2 * 2
            for name in kept:
                assert torch.equal(held[name][: len(sent[name])], sent[name]), name
            assert segments(token) == []
            mappings.append(ray.get(engine.segment_mappings.remote()))
            assert len(mappings[-1]) == 1 and mappings[-1][0].endswith("(deleted)"), mappings[-1]
        assert mappings[0] == mappings[1] == mappings[2]  # the same memory, at the same address
    finally:
        ray.kill(source)
        ray.kill(engine)


def test_a_bad_checksum_is_refused_and_no_file_is_left(ray_cluster, tiny_model):
    source = ModelSource.remote(str(tiny_model))
    engine = VLLMEngine.remote(str(tiny_model))
    group = RolloutGroup([engine], WeightSyncConfig(transport="shm", bucket_mb=0.25, timeout_s=30))
    try:
        group.connect([source])
        token, _ = ray.get(source.transports.remote())
        group.push()
        before = ray.get(engine.parameters.remote())["model.embed_tokens.weight"]
        ray.get(source.perturb.remote(0.3))
        ray.get(source.fault.remote("checksum"))
        with pytest.raises(WeightSyncError, match=r"pushing weights version 2: worker 0: WeightSyncError: bucket 0 .* arrived with checksum"):
            group.push()
        assert group.version == 1 and ray.get(engine.status.remote())[1] == 1
        # refused before the engine loaded anything of it
        assert torch.equal(ray.get(engine.parameters.remote())["model.embed_tokens.weight"], before)
        assert segments(token) == [] and ray.get(engine.segment_mappings.remote()) == []
    finally:
        ray.kill(source)
        ray.kill(engine)


def test_a_sender_that_dies_mid_push_leaves_no_file(ray_cluster, tiny_model):
    source = ModelSource.remote(str(tiny_model))
    engine = VLLMEngine.remote(str(tiny_model))
    group = RolloutGroup([engine], WeightSyncConfig(transport="shm", timeout_s=5))
    try:
        ray.get([engine.status.remote(), source.weight_sync_address.remote()])  # both started (the timeout is short)
        group.connect([source])
        token, _ = ray.get(source.transports.remote())
        ray.get(source.fault.remote("die"))
        with pytest.raises(WeightSyncError, match="sender died"):
            group.push()
        assert ray.get(engine.status.remote())[1] == 0
        # the engine timed out waiting for the first bucket and removed the file its sender left
        assert segments(token) == [] and ray.get(engine.segment_mappings.remote()) == []
    finally:
        ray.kill(source)
        ray.kill(engine)


def test_auto_is_shm_for_vllm_and_gloo_for_the_rest_and_gloo_when_forced(ray_cluster, tiny_model):
    prompts = ["def add(a, b):", "def fib(n):", "class Stack:"]
    source = ModelSource.remote(str(tiny_model))
    vllm_worker = RolloutWorker.remote(str(tiny_model), "vllm", threads=1)
    hf_worker = RolloutWorker.remote(str(tiny_model), "transformers", threads=1)
    try:
        # auto: the vLLM worker on this node maps the file, the transformers one takes the broadcast
        group = RolloutGroup([vllm_worker, hf_worker], WeightSyncConfig(bucket_mb=0.25, timeout_s=60))
        group.connect([source])
        token, transports = ray.get(source.transports.remote())
        assert transports == {1: "shm", 2: "gloo"}
        ray.get(source.perturb.remote(0.3))
        group.push()
        def same_greedy(what):
            # vLLM's and transformers' kernels round differently: equal greedy tokens up to a near-tie (tests/rounding.py)
            (from_vllm, from_hf) = (RolloutGroup([w]).generate(prompts, GREEDY) for w in (vllm_worker, hf_worker))
            model = reference_model(tiny_model, ray.get(source.weights.remote()))
            outputs = [[r.samples[0].token_ids for r in rollouts] for rollouts in (from_vllm, from_hf)]
            assert_same_greedy(model, [r.prompt_ids for r in from_hf], outputs[1], outputs[0], what=what)
            return outputs[0]

        outputs = same_greedy("shm")
        assert segments(token) == []
        # forced gloo: both engines take the broadcast, no file is made
        forced = RolloutGroup([vllm_worker, hf_worker], WeightSyncConfig(transport="gloo", bucket_mb=0.25, timeout_s=60))
        forced.version = group.version
        forced.connect([source])
        token, transports = ray.get(source.transports.remote())
        assert transports == {1: "gloo", 2: "gloo"}
        ray.get(source.perturb.remote(0.3))
        forced.push()
        assert same_greedy("forced gloo") != outputs
        assert ray.get(vllm_worker.status.remote())[1] == 2
    finally:
        for actor in (source, vllm_worker, hf_worker):
            ray.kill(actor)


def test_shm_for_an_engine_on_another_node_is_refused_by_name():
    """Two ranks on loopback that say different Ray nodes: the engine refuses shm, the sender names it."""
    import threading

    from common.placement import free_port
    from common.weight_sync import open_group

    port = free_port("127.0.0.1")
    errors = {}

    def join(rank, node):
        try:
            open_group("shm", "127.0.0.1", port, rank, 2, 10, node)
        except WeightSyncError as e:
            errors[rank] = str(e)

    threads = [threading.Thread(target=join, args=(rank, node)) for rank, node in ((0, "node-a"), (1, "node-b"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert "engine rank 1 is on Ray node node-b, the learner's rank 0 on node-a" in errors[1]
    assert errors[0].startswith("weight-sync rank 1 could not join: rollout.weight_sync.transport 'shm'")


def test_transport_values_that_cannot_work_are_config_errors():
    from rollout_workers.config import RolloutConfig

    with pytest.raises(ValueError, match="transformers backend receives weights by gloo"):
        RolloutConfig(backend="transformers", weight_sync={"transport": "shm"})
    with pytest.raises(ValueError, match="'auto', 'shm', 'gloo' or 'nccl'"):
        WeightSyncConfig(transport="mpi")
