"""A memory and placement plan of a config before launch: for each actor, where it goes and what its
memory holds, checked against what the cluster's node types (or this machine) have.

    coderloo plan --config configs/qwen2.5-coder-7b.yaml --cluster cluster.yaml

Pure arithmetic on the config, the model's shape and the cluster file: nothing starts. The model's
shape comes from its config.json at model.path, from model.tiny for a model the run builds, or from
the published Qwen2.5-Coder shapes (PUBLISHED) for a directory named after one that is not on this
machine. Every byte count below says what it stands for; the constants that are not arithmetic are
measured here (bench/results.md, the soak's resident memory per actor) or say that they are not.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from coderloo.ops.cluster_files import placement_problems, validate_cluster_file
from coderloo.runtime import ENV_DEFAULTS, resolve
from sandbox_pool.pool import RESOURCE as SANDBOX_RESOURCE

GiB, MiB = 2**30, 2**20
DTYPE_BYTES = {"float32": 4, "bfloat16": 2}


class PlanError(ValueError):
    """A config whose plan cannot be made (a model of unknown shape, a node type of unknown memory)."""


@dataclass(frozen=True)
class Architecture:
    """The shape of a Qwen2 causal LM (Qwen2.5-Coder's architecture)."""

    vocab: int  # embedding rows (a padded vocabulary counts its padding)
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    tied: bool  # the head shares the input embedding
    max_positions: int = 32768

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    def layer_parameters(self) -> int:
        """One decoder layer: q, k, v (with biases), o (no bias), the MLP's gate, up and down, 2 RMSNorms."""
        h, i, kv = self.hidden, self.intermediate, self.kv_dim
        attention = (h * h + h) + 2 * (h * kv + kv) + h * h
        return attention + 3 * h * i + 2 * h

    def parameters(self) -> int:
        """All of them, as `sum(p.numel())` of the model counts them (a tied head once)."""
        embeddings = self.vocab * self.hidden
        return embeddings * (1 if self.tied else 2) + self.layers * self.layer_parameters() + self.hidden

    def lora_parameters(self, rank: int, modules: list[str]) -> int:
        """A LoRA adapter of `rank` on the linear layers named in `modules`: rank x (in + out) each."""
        h, i, kv = self.hidden, self.intermediate, self.kv_dim
        shapes = {"q_proj": (h, h), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (h, h),
                  "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}
        return self.layers * sum(rank * sum(shapes[m]) for m in modules if m in shapes)

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """vLLM's KV cache per token: a key and a value of every KV head in every layer."""
        return self.layers * 2 * self.kv_dim * dtype_bytes

    def activation_bytes_per_token_per_layer(self, dtype_bytes: int) -> int:
        """What autograd keeps of one decoder layer per token for the backward, without activation
        checkpointing, with SDPA attention (flash: no T x T scores). Measured with
        torch.autograd.graph.saved_tensors_hooks on real Qwen2 layers (tests/test_plan.py): in the
        training dtype, 6 hidden-wide tensors (the two norms' outputs, the q/k/v input, q and its
        rotated half, the attention output), 4 MLP-wide (gate, its SiLU, up, their product) and 2
        KV-wide (k and its rotated half); in fp32, the two norms' upcast inputs, the attention's
        logsumexp per head and the norms' inverse RMS per token."""
        return dtype_bytes * (6 * self.hidden + 4 * self.intermediate + 2 * self.kv_dim) + 4 * (2 * self.hidden + self.heads + 2)

    def activation_bytes_per_token_outside_layers(self, dtype_bytes: int) -> int:
        """Per token beyond the layers: the final norm (its upcast input, output), RoPE's cos and sin,
        the token ids (measured as above), and the chunked head's gathered input states and their
        indices (learner/logits.py)."""
        return (3 * dtype_bytes + 4) * self.hidden + 2 * dtype_bytes * self.head_dim + 8 + 4 + 16


# Qwen2.5-Coder's published config.json values, and those of the catalogue's models as `coderloo model
# fetch` writes them (the 0.5B's quantised output layer comes out untied), for a model.path that is not
# on this machine.
PUBLISHED = {
    "qwen2.5-coder-0.5b": Architecture(151936, 896, 4864, 24, 14, 2, tied=True),
    "qwen2.5-coder-0.5b-instruct": Architecture(151936, 896, 4864, 24, 14, 2, tied=False),
    "smollm2-135m-instruct": Architecture(49152, 576, 1536, 30, 9, 3, tied=True, max_positions=8192),
    "qwen2.5-coder-1.5b": Architecture(151936, 1536, 8960, 28, 12, 2, tied=True),
    "qwen2.5-coder-7b": Architecture(152064, 3584, 18944, 28, 28, 4, tied=False),
}

# Resident memory of the processes around the model, measured in the soak (bench/results.md: 790
# steps of configs/soak.yaml, `rss_mb/<actor>` at its end).
DRIVER_BYTES = 920 * MiB  # the controller: tasks, tokenizer, Ray's driver
RAY_HEAD_BYTES = (359 + 97 + 213 + 211) * MiB  # raylet, GCS, Serve's controller and HTTP proxy
# Ray's dashboard (config.dashboard): its head and the ten processes of its modules, 1,062 MB together
# in the 0.5B run of bench/results.md ("real_models"), its agent 128 MB and the runtime-env agent 81.
DASHBOARD_BYTES = (1062 + 128 + 81) * MiB
REPLICA_BYTES = 229 * MiB  # a reward-service replica (its sandbox pool's dispatcher runs in it, in a thread)
EXECUTOR_BYTES = 150 * MiB  # a sandbox executor and its fork server, without the programs
# A learner rank's process: torch, DeepSpeed, transformers and Ray (their import alone: 0.6 GiB; the
# soak's learner-0, 1,104 MB, less this plan's 0.3 GiB of its states and activations).
LEARNER_PROCESS_BYTES = 800 * MiB
# A vLLM CPU worker's process beyond its weights and KV cache: the soak's rollout-0 peaked at
# 2,458 MB with a 1 GiB KV cache and a 2 MB model.
VLLM_CPU_PROCESS_BYTES = 1400 * MiB
# On a GPU node, not measured (no GPU was at hand): the CUDA context, NCCL's buffers and the caching
# allocator's slack on a learner's GPU, and a GPU worker's process on its host.
CUDA_CONTEXT_BYTES = 1 * GiB
GPU_PROCESS_HOST_BYTES = 4 * GiB

# DeepSpeed's ZeRO buffers at its defaults (deepspeed/runtime/zero/config.py), in elements.
ZERO_REDUCE_BUCKET = 500_000_000
ZERO3_PREFETCH_BUCKET = 50_000_000

# Memory of the instance types cluster files name: host GiB, and the GPU's name and GiB (what
# nvidia-smi reports); a node type's `resources: {memory: BYTES}` overrides the host's.
INSTANCE_TYPES = {
    "m6i.4xlarge": (64, None, 0),
    "c6i.4xlarge": (32, None, 0),
    "g6e.12xlarge": (384, "L40S", 46068 / 1024),
    "g6e.xlarge": (32, "L40S", 46068 / 1024),
    "p4d.24xlarge": (1152, "A100 40GB", 40),
    "p4de.24xlarge": (1152, "A100", 80),
    "p5.48xlarge": (2048, "H100", 79.6),
}


def architecture(model) -> tuple[Architecture, str]:
    """The shape of `model` (coderloo.config.ModelConfig) and where it was read from."""
    path = resolve(model.path)
    if (path / "config.json").is_file():
        c = json.loads((path / "config.json").read_text())
        try:
            return Architecture(c["vocab_size"], c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"],
                                c["num_attention_heads"], c.get("num_key_value_heads") or c["num_attention_heads"],
                                tied=bool(c.get("tie_word_embeddings", False)),
                                max_positions=c.get("max_position_embeddings", 32768)), f"{path / 'config.json'}"
        except KeyError as e:
            raise PlanError(f"{path / 'config.json'}: no {e.args[0]} (a Qwen2-style config.json is expected)") from None
    if model.build_tiny:
        t = model.tiny
        return Architecture(max(t.vocab_size, t.vocab_rows or 0), t.hidden_size, t.intermediate_size, t.num_layers,
                            t.num_heads, t.num_kv_heads, tied=t.tie_word_embeddings,
                            max_positions=t.max_position_embeddings), "model.tiny (built by the run)"
    published = PUBLISHED.get(path.name.lower())
    if published is None:
        raise PlanError(f"model.path {model.path}: no config.json there, and its name is none of the published shapes "
                        f"this plan knows ({', '.join(PUBLISHED)}): copy the model's config.json there")
    return published, f"the published {path.name} shape ({model.path} is not on this machine)"


def ray_memory_threshold() -> float:
    """The share of a node's memory Ray's memory monitor lets its workers use before it kills one
    (`RAY_memory_usage_threshold`, 0.95 by default): the most a plan may fill."""
    return float(os.environ.get("RAY_memory_usage_threshold", 0.95))


@dataclass
class Node:
    """Where actors go: a node type of the cluster file (or this machine), its memory and how many there are."""

    name: str
    host_bytes: float  # what Ray lets its workers use (`ray_memory_threshold` of the node's memory)
    gpu_name: str | None = None
    gpu_bytes: float = 0.0
    count: int = 1
    resources: dict = field(default_factory=dict)


@dataclass
class Actor:
    """One kind of actor: `count` of them, each holding `components` (bytes) on `device`."""

    name: str
    count: int
    node: Node | None
    device: str  # "cpu": the components are host memory; "gpu": memory of the actor's one GPU
    components: dict[str, float]
    fields: str  # what to change when it does not fit
    asks: dict[str, float] = field(default_factory=dict)  # Ray resources each asks for (GPUs included)
    host_bytes: float = 0.0  # a GPU actor's process on its host

    @property
    def total(self) -> float:
        return sum(self.components.values())

    @property
    def capacity(self) -> float | None:
        if self.node is None:
            return None
        return self.node.gpu_bytes if self.device == "gpu" else self.node.host_bytes


@dataclass
class Plan:
    actors: list[Actor]
    model_source: str
    parameters: int
    where: str  # the cluster file, or this machine
    problems: list[str]
    notes: list[str]

    @property
    def fits(self) -> bool:
        return not self.problems


def _learner(config, arch: Architecture) -> tuple[dict[str, float], list[str]]:
    """One learner rank's memory, ZeRO-partitioned as DeepSpeed does it (stage 1: optimizer state; 2: and
    gradients; 3: and weights), and the sentences that say how."""
    learner = config.learner
    b = DTYPE_BYTES[learner.dtype]
    world, stage = learner.num_ranks, learner.zero_stage
    n = arch.parameters()
    on_gpu = learner.device == "cuda"
    if learner.lora is None:
        trained = n
    else:
        trained = arch.lora_parameters(learner.lora.rank, learner.lora.target_modules)
        trained += sum(arch.vocab * arch.hidden for m in learner.lora.modules_to_save if m in ("embed_tokens", "lm_head"))
    separate = learner.advantage.type == "ppo" and learner.advantage.value_model == "separate"
    if learner.advantage.type == "ppo":
        # separate: a second backbone and head, trained whole; shared: a scalar head on the policy
        trained_value = n + arch.hidden + 1 if separate else arch.hidden + 1
    else:
        trained_value = 0

    def states(weights: int, trained: int) -> dict[str, float]:
        """Weights, gradients, the fp32 master copy (bf16), Adam's two moments: of a model of `weights`
        parameters, `trained` of which train."""
        share = lambda count, from_stage: count / world if stage >= from_stage else count  # noqa: E731
        out = {"weights": share(weights, 3) * b, "gradients": share(trained, 2) * b,
               "optimizer": share(trained, 1) * (8 + (4 if b < 4 else 0))}
        if b < 4 and stage >= 1:  # the fp32 gradient of the master partition that the optimizer steps on
            out["gradients"] += share(trained, 1) * 4
        return out

    parts = states(n, trained)
    if trained_value:
        value = states(n if separate else 0, trained_value)
        parts["value model"] = sum(value.values())
    parts.update(_zero_buffers(arch, stage, world, n, trained, b, on_gpu))
    if learner.own_reference:  # a full copy (with LoRA: the base, adapter off); one that moves is fp32
        parts["reference"] = n * (4 if learner.kl.reference_mix else b)
    activations, note = _activations(learner, arch, b)
    parts.update(activations)
    parts["runtime"] = CUDA_CONTEXT_BYTES if on_gpu else LEARNER_PROCESS_BYTES
    notes = [f"learner rank: {learner.dtype} ZeRO-{stage} over {world} ranks; {trained:,} of {n:,} parameters train"
             f"{' (LoRA)' if learner.lora else ''}; {note}"]
    return parts, notes


def _zero_buffers(arch: Architecture, stage: int, world: int, n: int, trained: int, b: int, on_gpu: bool) -> dict[str, float]:
    """DeepSpeed's buffers: ZeRO-1/2's reduce bucket (a torch.empty of the bucket's size: all of it
    held on a GPU, the pages gradients touch on a CPU); ZeRO-3's gathered layers, prefetch and
    reduce buckets, and the whole model a weight push gathers on every rank at once
    (Learner._whole_parameters), counted as if beside the activations."""
    if stage in (1, 2):
        bucket = ZERO_REDUCE_BUCKET if on_gpu else min(ZERO_REDUCE_BUCKET, trained)
        return {"ZeRO buffers": bucket * (4 if stage == 1 else b)}
    if stage == 3:
        gathered = 2 * arch.layer_parameters() + arch.vocab * arch.hidden
        return {"ZeRO buffers": (gathered + min(ZERO3_PREFETCH_BUCKET, n) + 2 * min(ZERO_REDUCE_BUCKET, trained)) * b,
                "push gather": (n - n / world) * b}
    return {}


def _activations(learner, arch: Architecture, b: int) -> tuple[dict[str, float], str]:
    """A micro-batch's activations and the head's logits, and the sentence that says how."""
    tokens = learner.max_tokens_per_micro_batch
    per_layer = arch.activation_bytes_per_token_per_layer(b)
    if learner.gradient_checkpointing:
        # each layer's input alone is kept, and the layer being recomputed holds all of its own
        kept, kept_note = arch.layers * arch.hidden * b + per_layer, f"{arch.layers} layer inputs x {arch.hidden * b:,} B + one layer's {per_layer:,} B"
    else:
        kept, kept_note = arch.layers * per_layer, f"{arch.layers} layers x {per_layer:,} B"
    per_token = kept + arch.activation_bytes_per_token_outside_layers(b)
    # rows of several sequences (or trees) need a mask, W x W per row of width W: at most one row of the
    # whole budget, as booleans and as the additive mask all layers keep (PackedBatch.model_inputs)
    mask = tokens * tokens * (1 + b) if learner.pack_sequences or learner.share_prefixes else 0
    parts = {"activations": tokens * per_token + mask,
             # the head on a chunk at a time: its logits, the fp32 log-softmax and its gradient
             "logits": min(learner.logit_chunk_tokens, tokens) * arch.vocab * 4 * 3}
    note = (f"activations {per_token / 1024:.1f} KiB per token "
            f"({kept_note} + {arch.activation_bytes_per_token_outside_layers(b):,} B"
            f"{'; learner.gradient_checkpointing' if learner.gradient_checkpointing else ''}) x learner.max_tokens_per_micro_batch={tokens}; "
            f"logits: min(learner.logit_chunk_tokens={learner.logit_chunk_tokens}, {tokens}) x {arch.vocab:,} x 4 B x 3"
            + (f"; and the attention mask, {tokens}^2 x (1 + {b}) B" if mask else ""))
    return parts, note


def _kv_space_bytes() -> float:
    """vLLM's CPU KV cache: VLLM_CPU_KVCACHE_SPACE GiB (coderloo/runtime.py sets its default)."""
    raw = os.environ.get("VLLM_CPU_KVCACHE_SPACE", ENV_DEFAULTS["VLLM_CPU_KVCACHE_SPACE"])
    try:
        return float(raw) * GiB
    except ValueError:
        raise PlanError(f"VLLM_CPU_KVCACHE_SPACE={raw!r}: not a number of GiB") from None


def _push_bytes(config, arch: Architecture) -> float:
    """What a CPU engine holds of a weight push: over shared memory (the same node: transport auto
    or shm) the whole push's segment, kept mapped from push to push, the weights as the learner
    sends them, a tied head under both its names (the scale run's pushes: 1,260 MB for 494M
    parameters in bf16); over gloo, one bucket while it loads it."""
    sync = config.rollout.weight_sync
    if sync.transport == "gloo":
        return float(sync.bucket_bytes)
    return float((arch.parameters() + (arch.vocab * arch.hidden if arch.tied else 0)) * DTYPE_BYTES[config.learner.dtype])


def _rollout(config, arch: Architecture, node: Node | None) -> tuple[dict[str, float], list[str], list[str]]:
    """One rollout worker's memory (host for a CPU engine, its GPU's for a GPU one), notes and problems."""
    rollout = config.rollout
    weights = arch.parameters() * (DTYPE_BYTES[rollout.dtype] if rollout.backend == "vllm" else 4)
    if rollout.backend == "transformers":
        return {"weights": weights, "runtime": LEARNER_PROCESS_BYTES}, [], []
    per_token = arch.kv_bytes_per_token(DTYPE_BYTES[rollout.dtype])
    max_len = rollout.max_model_len or arch.max_positions
    problems = []
    if rollout.gpus_per_worker:
        if node is None or not node.gpu_bytes:
            return {"weights": weights}, ["rollout worker: GPU memory not checked (no cluster file)"], []
        # vLLM takes this share of the GPU for everything it holds (weights, activations, KV cache)
        budget = rollout.gpu_memory_utilization * node.gpu_bytes
        kv = max(budget - weights, 0.0)
        parts = {"weights": weights, "KV cache": kv}
        field_hint = "raise rollout.gpu_memory_utilization or lower rollout.max_model_len"
        source = f"rollout.gpu_memory_utilization={rollout.gpu_memory_utilization} x {node.gpu_bytes / GiB:.1f} GiB - weights"
    else:
        kv = _kv_space_bytes()
        parts = {"weights": weights, "KV cache": kv, "runtime": VLLM_CPU_PROCESS_BYTES, "weight push": _push_bytes(config, arch)}
        field_hint = "raise VLLM_CPU_KVCACHE_SPACE or lower rollout.max_model_len"
        source = f"VLLM_CPU_KVCACHE_SPACE={kv / GiB:g} GiB"
    holds = int(kv // per_token)
    if holds < max_len:  # vLLM refuses to start an engine whose cache cannot hold one longest sequence
        problems.append(f"rollout worker: its KV cache ({source}) holds {holds:,} tokens, fewer than one sequence of "
                        f"rollout.max_model_len={max_len:,}; {field_hint}")
    notes = [f"rollout worker: KV cache {source}: {holds:,} tokens at {per_token / 1024:g} KiB per token "
             f"({arch.layers} layers x 2 x {arch.kv_dim} x {DTYPE_BYTES[rollout.dtype]} B)"]
    return parts, notes, problems


def _nodes(cluster: dict) -> dict[str, Node]:
    nodes = {}
    for name, t in cluster["available_node_types"].items():
        instance = (t.get("node_config") or {}).get("InstanceType")
        host_gib, gpu_name, gpu_gib = INSTANCE_TYPES.get(instance, (None, None, 0))
        host = t["resources"].get("memory") or (host_gib * GiB * ray_memory_threshold() if host_gib else None)
        if host is None:
            raise PlanError(f"node type {name}: its memory is unknown (instance type {instance!r}): give it "
                            f"`resources: {{memory: BYTES}}` or add the instance type to coderloo/ops/plan.py INSTANCE_TYPES")
        if t["resources"].get("GPU") and not gpu_gib:
            raise PlanError(f"node type {name}: offers GPUs of unknown memory (instance type {instance!r}): add it to "
                            "coderloo/ops/plan.py INSTANCE_TYPES")
        count = 1 if name == cluster["head_node_type"] else t.get("max_workers", 0)
        nodes[name] = Node(name, host, gpu_name, gpu_gib * GiB, count, t["resources"])
    return nodes


def _place(nodes: dict[str, Node], head: str, resources: dict, gpus: float) -> Node | None:
    """The node type an actor asking for `resources` and `gpus` lands on (none asked: the head); of several
    that offer them all, Ray may take any: the one of the least memory, the worst case."""
    if not resources and not gpus:
        return nodes[head]
    offering = [node for node in nodes.values()
                if all(node.resources.get(r, 0) >= a for r, a in resources.items()) and node.resources.get("GPU", 0) >= gpus]
    return min(offering, key=lambda n: (n.gpu_bytes if gpus else n.host_bytes), default=None)


def _local_node() -> Node:
    import psutil

    return Node("this machine", psutil.virtual_memory().total * ray_memory_threshold(), resources={"CPU": os.cpu_count() or 1})


def plan(config, cluster: dict | None = None, cluster_name: str | None = None) -> Plan:
    """The plan of `config` (coderloo.config.Config) on `cluster` (a cluster file's config, as
    coderloo.ops.cluster_files.validate_cluster_file returns it; None: this machine)."""
    arch, source = architecture(config.model)
    local = cluster is None or cluster["provider"].get("type") == "fake_multinode"  # fake nodes share this machine
    gpu_config = config.learner.device == "cuda" or config.rollout.gpus_per_worker > 0
    notes, problems = [], []
    if local:
        machine = _local_node()
        nodes, head = {machine.name: machine}, machine.name
        place = lambda resources, gpus: machine  # noqa: E731
        if gpu_config:
            notes.append("no cluster file: GPU memory is not checked (give --cluster for the node types' GPUs)")
    else:
        nodes, head = _nodes(cluster), cluster["head_node_type"]
        place = lambda resources, gpus: _place(nodes, head, resources, gpus)  # noqa: E731
        problems += placement_problems(cluster, config)
    actors, more_notes, rollout_problems = _actors(config, arch, nodes, head, place, local)
    notes += more_notes
    problems += rollout_problems
    problems += _memory_problems(actors, nodes, local and gpu_config)
    where = "this machine" if cluster is None else (cluster_name or "the cluster file")
    return Plan(actors, source, arch.parameters(), where, problems, notes)


def _actors(config, arch: Architecture, nodes: dict[str, Node], head: str, place, local: bool) -> tuple[list[Actor], list[str], list[str]]:
    """Each kind of actor, placed by `place(resources, gpus)`, and its memory; the learner's and
    rollout workers' notes, and the rollout workers' problems."""
    reward = config.reward
    learner_parts, learner_notes = _learner(config, arch)
    learner_gpu = config.learner.device == "cuda"
    learner_node = place(config.learner.resources, 1 if learner_gpu else 0)
    rollout_node = place(config.rollout.resources, config.rollout.gpus_per_worker)
    rollout_parts, rollout_notes, rollout_problems = _rollout(config, arch, None if local else rollout_node)
    rollout_gpu = config.rollout.gpus_per_worker > 0 and config.rollout.backend == "vllm"
    sandbox_node = place({SANDBOX_RESOURCE: reward.pool.concurrency_per_executor}, 0)
    actors = [
        Actor("driver", 1, nodes[head], "cpu", {"runtime": DRIVER_BYTES + RAY_HEAD_BYTES + config.dashboard * DASHBOARD_BYTES},
              "(the controller and Ray's head processes; dashboard false saves 1.2 GiB)"),
        Actor("learner rank", config.learner.num_ranks, learner_node, "gpu" if learner_gpu else "cpu", learner_parts,
              "raise learner.zero_stage or learner.num_ranks, or lower learner.max_tokens_per_micro_batch"
              + ("" if config.learner.gradient_checkpointing else ", or set learner.gradient_checkpointing"),
              {**config.learner.resources, **({"GPU": 1} if learner_gpu else {})},
              GPU_PROCESS_HOST_BYTES if learner_gpu else 0.0),
        Actor("rollout worker", config.rollout.num_workers, rollout_node, "gpu" if rollout_gpu else "cpu", rollout_parts,
              "lower rollout.gpu_memory_utilization" if rollout_gpu else "lower VLLM_CPU_KVCACHE_SPACE or rollout.num_workers",
              {**config.rollout.resources, **({"GPU": config.rollout.gpus_per_worker} if config.rollout.gpus_per_worker else {})},
              GPU_PROCESS_HOST_BYTES if rollout_gpu else 0.0),
        Actor("reward replica", reward.autoscaling.max_replicas, nodes[head], "cpu", {"runtime": REPLICA_BYTES},
              "lower reward.autoscaling.max_replicas"),
        Actor("sandbox executor", reward.autoscaling.max_replicas * reward.pool.max_executors, sandbox_node, "cpu",
              {"programs": reward.pool.concurrency_per_executor * reward.limits.memory_mb * MiB, "runtime": EXECUTOR_BYTES},
              "lower reward.limits.memory_mb, reward.pool.concurrency_per_executor or reward.pool.max_executors",
              {SANDBOX_RESOURCE: reward.pool.concurrency_per_executor}),
    ]
    if config.critic.enabled:  # an fp32 backbone trained whole with AdamW: weights, gradients, two moments
        backbone = arch.parameters() - (0 if arch.tied else arch.vocab * arch.hidden)
        actors.append(Actor("critic", 1, nodes[head], "cpu", {"weights": 4 * backbone, "gradients": 4 * backbone,
                                                             "optimizer": 8 * backbone, "runtime": LEARNER_PROCESS_BYTES},
                            "set critic.enabled false"))
    return actors, learner_notes + rollout_notes, rollout_problems


def _memory_problems(actors: list[Actor], nodes: dict[str, Node], unchecked_gpus: bool) -> list[str]:
    """Each GPU actor against its GPU; each node type's host memory against the actors it holds, spread
    over as many of its nodes as the resources they ask for take."""
    problems = []
    for a in actors:
        if a.device == "gpu" and a.node is not None and a.node.gpu_bytes and a.total > a.node.gpu_bytes:
            problems.append(f"{a.name}: needs {a.total / GiB:.1f} GiB of GPU memory, the {a.node.name} node's "
                            f"{a.node.gpu_name} has {a.node.gpu_bytes / GiB:.0f} GiB; {a.fields}")
    if unchecked_gpus:
        return problems
    for node in nodes.values():
        held = [a for a in actors if a.node is node and a.count]
        if not held:
            continue
        spread = max(1, min(node.count, max(_nodes_needed(a, node) for a in held)))
        per_node = {a.name: min(math.ceil(a.count / spread), _fit_on_one(a, node)) * (a.host_bytes if a.device == "gpu" else a.total)
                    for a in held}
        need = sum(per_node.values())
        if need > node.host_bytes:
            biggest = max(held, key=lambda a: per_node[a.name])
            on = "this machine" if node.name == "this machine" else f"each of {spread} {node.name} node{'s' * (spread > 1)}"
            listed = ", ".join(f"{name} {size(b)}" for name, b in per_node.items() if b)
            problems.append(f"{biggest.name}: {need / GiB:.1f} GiB of host memory needed on {on}, where Ray lets workers "
                            f"use {node.host_bytes / GiB:.1f} GiB ({listed}); {biggest.fields}")
    return problems


def _nodes_needed(actor: Actor, node: Node) -> int:
    """How many nodes of `node`'s type `actor.count` actors take, by the resources each asks for."""
    return max([math.ceil(actor.count * amount / node.resources[r]) for r, amount in actor.asks.items()
                if amount and node.resources.get(r)] or [1])


def _fit_on_one(actor: Actor, node: Node) -> int:
    """How many such actors one node of `node`'s type has room for (Ray places no more there)."""
    return min([int(node.resources[r] // amount) for r, amount in actor.asks.items() if amount and node.resources.get(r)]
               or [actor.count])


def size(n: float) -> str:
    return f"{n / GiB:.1f} GiB" if n >= GiB else f"{n / MiB:.0f} MiB"


def _row(a: Actor, components: list[str], problems: list[str]) -> list[str]:
    """An actor's row of the table: the memory of each component, its total and the capacity it has."""
    where = "?" if a.node is None else a.node.name
    cap = a.capacity
    unchecked = cap is None or (a.device == "gpu" and not cap)
    fits = "?" if unchecked else ("no" if any(pr.startswith(a.name + ":") for pr in problems) else "yes")
    gpu = f" {a.node.gpu_name}" if a.device == "gpu" and a.node and a.node.gpu_name else ""
    return [a.name, str(a.count), where, f"{a.device}{gpu}", *[size(a.components[c]) if c in a.components else "-" for c in components],
            size(a.total), "-" if unchecked else size(cap), fits]


def table(p: Plan) -> str:
    """The plan as text: one row per actor, a column per component (bytes of each actor, on its device)."""
    components = list(dict.fromkeys(c for a in p.actors for c in a.components))
    header = ["actor", "count", "where", "memory", *components, "total", "capacity", "fits"]
    rows = [_row(a, components, p.problems) for a in p.actors]
    widths = [max(len(r[i]) for r in [header] + rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in [header] + rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines.insert(0, f"model: {p.parameters:,} parameters ({p.model_source}); on {p.where}")
    lines += [f"  {n}" for n in p.notes]
    lines.append("fits" if p.fits else "does not fit:")
    lines += [f"  {pr}" for pr in p.problems]
    return "\n".join(lines)


def plan_from_files(config, cluster_file: str | None) -> Plan:
    """`plan` of `config` on the cluster file `cluster_file` (None: this machine)."""
    if cluster_file is None:
        return plan(config)
    return plan(config, validate_cluster_file(cluster_file), cluster_name=str(cluster_file))


HEADER_START = "# Memory and placement plan"
HEADER_END = "# (end of the plan)"


def header(p: Plan, command: str) -> str:
    """The plan as a block of YAML comments, saying which command regenerates it."""
    lines = [f"{HEADER_START} (estimated from the shapes, not measured on GPUs; `{command}` rewrites this block):"]
    lines += [f"#   {line}".rstrip() for line in table(p).splitlines()]
    return "\n".join(lines + [HEADER_END]) + "\n"


def write_header(config_file: str | Path, block: str) -> None:
    """Put `block` in place of the plan's block in `config_file` (or before its first setting when it has none)."""
    path = Path(config_file)
    text = path.read_text()
    start, end = text.find(HEADER_START), text.find(HEADER_END)
    if start >= 0 and end > start:
        text = text[:start] + block + text[end + len(HEADER_END) + 1:]
    else:
        lines = text.splitlines(keepends=True)
        first = next((i for i, line in enumerate(lines) if line.strip() and not line.startswith("#")), len(lines))
        text = "".join(lines[:first]) + block + "".join(lines[first:])
    path.write_text(text)
