"""The DeepSpeed learner: one Ray actor per rank; the ranks form one torch.distributed group.

`learner.group.LearnerGroup` creates the ranks, deals each step's micro-batches to them and
merges their statistics. Each rank runs the same number of forward/backward passes per optimizer
step (ZeRO-2 and 3 reduce gradients at each backward; with ZeRO 0-1 DeepSpeed reduces them at the
step, which a streamed step relies on: open_step); gradients are accumulated by us over a variable
number of token-budget micro-batches (DeepSpeed's unmanaged gradient accumulation), and every
loss is a sum over tokens divided by a normalizer of the whole mini-batch across ranks, so the
gradient does not depend on how the batch was split.
"""
from __future__ import annotations

import contextlib
import math
import os
import resource
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import ray
import torch

from common.cpus import pin_process
from common.memory import limit_own_memory, return_free_memory
from common.weight_sync import WeightSource
from learner import lora
from learner.batch import PackedBatch, TrainSequence, pack, tree_tokens
from learner.config import PolicyLoss
from learner.logits import chunked_logprobs, final_hidden_states
from learner.losses import LossInputs, kl_penalty, policy_loss, sft_loss, value_loss
from learner.value import ValueModel, add_value_head, hidden_and_values, policy_state

REFERENCE_DIR = "reference"  # a checkpoint's KL reference (Hugging Face format)

# One rank's share of a step: for each mini-batch (optimizer step), its micro-batches, the
# normalizer of the whole mini-batch's policy loss and its trained tokens (over all ranks; the
# value loss is their mean).
Work = list[tuple[list[list[TrainSequence]], float, int]]


def mean_norm(norms: list[float | None]) -> float | None:
    """A step's gradient norm: the mean over its optimizer steps (verl's), not the last one's, which
    can be 0 where only that mini-batch's groups had equal rewards. None where a norm is unknown."""
    return None if not norms or None in norms else sum(norms) / len(norms)


@dataclass
class _Step:
    """A step under way on this rank: its loss's settings and what its statistics gather."""

    loss: PolicyLoss
    temperature: float
    kl_coef: float
    train_value: bool
    finite: bool = True  # every loss of the mini-batch so far
    skipped: int = 0  # optimizer steps not taken
    skipped_value: int = 0
    grad_norms: list = field(default_factory=list)  # each optimizer step's, before clipping
    value_grad_norm: float | None = None
    entropy_sum: float = 0.0
    step_starts: list = field(default_factory=list)  # each micro-batch's step-start logprobs, in order
    batches: list = field(default_factory=list)
    sums: dict = field(default_factory=dict)  # a streamed step's statistics, summed over its passes
    later: list = field(default_factory=list)  # a streamed step's later mini-batches: (index, batch, step-start logprobs)
    passes: int = 0
    busy_s: float = 0.0


def named_weights(model, base: bool = False) -> dict[str, torch.Tensor]:
    """The weights the rollout engines load, a tied embedding under both of its names; of a LoRA
    policy, merged (or with `base`, the weights under its adapter).

    A receiver that maps lm_head to the embedding ignores the extra name; one that does not would
    otherwise keep a stale lm_head and sample from the old policy without any error.
    """
    if lora.is_peft(model):
        state = lora.base_weights(model) if base else lora.merged_weights(model)
    else:
        state = model.state_dict()
    named = policy_state({name: p.detach() for name, p in state.items()})
    if model.config.tie_word_embeddings:
        named["lm_head.weight"] = model.get_input_embeddings().weight.detach()
    return named


def every_rank(flag: bool, world_size: int) -> bool:
    """Whether `flag` holds on every rank of the learner's group (an all-reduce: all ranks call it)."""
    if world_size == 1:
        return flag
    import torch.distributed as dist  # here: a method of the actor class that named it would not pickle

    agreed = torch.tensor([1.0 if flag else 0.0])
    dist.all_reduce(agreed, op=dist.ReduceOp.MIN)
    return bool(agreed.item())


TOKENIZER_FILES = ("special_tokens_map.json", "vocab.json", "merges.txt", "added_tokens.json",
                   "chat_template.jinja", "chat_template.json")  # besides tokenizer*: transformers keeps a chat template apart


def copy_tokenizer_files(model_path: str | Path, out: str | Path) -> None:
    """Copy the tokenizer files as they are: re-saving through a loaded class can change them."""
    for name in os.listdir(model_path):
        if name.startswith("tokenizer") or name in TOKENIZER_FILES:
            shutil.copy(Path(model_path) / name, Path(out) / name)


@ray.remote
class Learner(WeightSource):
    """One rank of the policy learner. `config` is a learner.config.LearnerConfig (its model,
    optimizer and precision; each step's loss comes with the step).

    Construction only records the arguments; `setup` joins the process group (all ranks at once)
    and builds the DeepSpeed engine. The learner knows nothing of sandboxes, HTTP or algorithms:
    it applies the loss it is given to the advantages it is given.
    """

    def __init__(self, model_path: str, config, rank: int = 0, world_size: int = 1):
        pin_process(config.cpus, "learner.cpus")  # before torch and DeepSpeed start their threads
        self.model_path = model_path
        self.config = config
        self.rank = rank
        self.world_size = world_size
        self.cgroup = None
        if config.memory_limit_mb is not None:
            name = ray.get_runtime_context().get_actor_name() or f"coderloo-learner-{rank}-{os.getpid()}"
            self.cgroup = limit_own_memory(name, config.memory_limit_mb)

    def memory_cgroup(self) -> str | None:
        """The memory cgroup that holds this rank's limit (learner.memory_limit_mb), or None."""
        return self.cgroup

    def rendezvous_address(self) -> tuple[str, int]:
        from common.placement import node_address_and_port

        return node_address_and_port()

    def unbuilt_ops(self) -> list[str]:
        """The DeepSpeed ops `setup` compiles on this node first (minutes; once per machine)."""
        from learner.ops import library_path, shm_comm_builder

        builder = shm_comm_builder() if self.config.device == "cpu" else None  # DeepSpeed's CPU collectives
        return [builder.NAME] if builder is not None and not library_path(builder).exists() else []

    def setup(self, master_addr: str, master_port: int) -> None:
        # Without the deepspeed launcher, DeepSpeed reads the rendezvous from the environment.
        os.environ.update(
            RANK=str(self.rank), WORLD_SIZE=str(self.world_size), LOCAL_RANK="0",
            MASTER_ADDR=master_addr, MASTER_PORT=str(master_port),
        )
        import deepspeed

        from common.hf import load_causal_lm, load_tokenizer
        from learner.ops import load_shm_comm_op

        config = self.config
        torch.manual_seed(config.seed)
        if config.device == "cpu":
            torch.set_num_threads(config.threads)
        accelerator = deepspeed.get_accelerator()
        backend = "gloo" if accelerator.device_name() == "cpu" else accelerator.communication_backend_name()
        if backend == "gloo":
            load_shm_comm_op()  # compiled once per machine, not once per virtualenv (learner/ops.py)
        deepspeed.init_distributed(dist_backend=backend, auto_mpi_discovery=False)
        self.tokenizer = load_tokenizer(self.model_path)
        self.pad_id = self.tokenizer.pad_token_id
        model = self._trainable(load_causal_lm(self.model_path))
        attention = model.config._attn_implementation
        if config.share_prefixes and attention != "sdpa":
            # the trees' boolean mask [R, 1, W, W] is what sdpa takes; flash attention takes none
            raise ValueError(f"learner.share_prefixes needs the model's attention to be sdpa, not {attention!r}: "
                             "set learner.share_prefixes=false")
        self.shared_value = config.advantage.type == "ppo" and config.advantage.value_model == "shared"
        if self.shared_value:
            add_value_head(model)
        if config.lora is not None and config.lora.start == "sft":
            model = lora.wrap(model, config.lora)
        self.value_engine = None  # value_model separate: built from the policy when RL starts (_value_model)
        self.reference = None  # with LoRA, the policy with its adapter disabled (_reference_logprobs)
        if config.own_reference:
            self.reference = self._load_reference(self.model_path)
        self.engine, self.optimizer = self._engine(model, config.lr)
        if self.reference is not None:
            self.reference.to(self.engine.device)
        self._open: _Step | None = None  # the step under way
        self.step_start_pass_always = False  # tests: the separate pass where one mini-batch needs none

    def _engine(self, model, lr: float):
        """A DeepSpeed engine of `model` with its own AdamW (the policy's; the value model's)."""
        import deepspeed

        config = self.config
        # Only what trains has optimizer state (with LoRA, the adapter).
        ratio = config.lora.lr_ratio if config.lora is not None else 1.0
        optimizer = torch.optim.AdamW(lora.parameter_groups(model, lr, ratio), lr=lr, weight_decay=config.weight_decay)
        ds_config = {
            "train_micro_batch_size_per_gpu": 1,  # batches are packed by us; the count is informational
            "gradient_accumulation_steps": 1,
            # We own the accumulation boundary: backward() accumulates, step() reduces and updates.
            "managed_gradient_accumulation": False,
            "gradient_clipping": config.max_grad_norm,
            "zero_optimization": {"stage": config.zero_stage},
            "bf16": {"enabled": config.dtype == "bfloat16"},
            "steps_per_print": 10**9,
        }
        engine, optimizer, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=ds_config)
        return engine, optimizer

    def start_lora(self) -> None:
        """lora.start rl: from here on, train an adapter on the policy as it is now (after the SFT
        warm-up, every weight of which trained). A collective under ZeRO-3."""
        if self.config.lora is None or lora.is_peft(self.engine.module):
            return
        model = self._policy_copy()
        self.engine = self.optimizer = None  # the full model's optimizer state goes
        self.engine, self.optimizer = self._engine(lora.wrap(model, self.config.lora), self.config.lr)

    def _policy_copy(self):
        """A new Hugging Face model holding the policy's weights as they are now (a LoRA
        policy's merged; without a shared value head). A collective under ZeRO-3."""
        from common.hf import load_causal_lm

        with self._whole_parameters():
            module = self.engine.module
            state = lora.merged_weights(module) if lora.is_peft(module) else module.state_dict()
            weights = {name: t.detach().clone() for name, t in policy_state(state).items()}
        model = self._trainable(load_causal_lm(self.model_path))
        model.load_state_dict(weights)
        return model

    def _trainable(self, model):
        """`model` as it trains here: with learner.gradient_checkpointing, each decoder layer is
        recomputed in the backward from its input (non-reentrant: no input needs a gradient)."""
        if self.config.gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        return model

    def _value_model(self):
        """The separate value model's engine, built at first use (the first RL step, or a resume)
        from the policy as it is then: after the SFT warm-up, as OpenRLHF and verl start their
        critic from the SFT model. A collective under ZeRO-3 (every rank builds it at once)."""
        if self.value_engine is None:
            self.value_engine, _ = self._engine(ValueModel(self._policy_copy()), self.config.advantage.value_lr or self.config.lr)
        return self.value_engine

    def _values(self, batch: PackedBatch) -> torch.Tensor:
        """The value model's estimates [B, T-1] (with gradient when it trains)."""
        device = self.engine.device
        if self.shared_value:
            return hidden_and_values(self.engine, self.engine.module, self._inputs(self.engine.module, batch))[1].float().cpu()
        return self._value_model()(**batch.model_inputs(device)).float().cpu()

    def _load_reference(self, path: str | Path):
        """The KL reference from `path`: frozen, in the training dtype (a float32 copy of a 7B model
        would take 30 GB per rank); one that moves (kl.reference_mix) in float32, as bf16's 8-bit
        mantissa would round a 0.001 mix away."""
        from common.hf import load_causal_lm

        dtype = "float32" if self.config.kl.reference_mix else self.config.dtype
        return load_causal_lm(path, dtype).eval().requires_grad_(False)

    def mix_reference(self, mix: float) -> None:
        """reference <- (1 - mix) x reference + mix x policy, in place (mix 1: the policy as it is
        now, where RL starts after the SFT warm-up). A collective under ZeRO-3."""
        with self._whole_parameters(), torch.no_grad():
            policy = dict(self.engine.module.named_parameters())
            for name, ref in self.reference.named_parameters():
                ref.mul_(1.0 - mix).add_(policy[name].to(ref.dtype), alpha=mix)

    def _reference_logprobs(self, batch: PackedBatch, temperature: float) -> torch.Tensor:
        """The KL reference's logprobs: its own copy, or with LoRA the policy with its adapter off."""
        if self.reference is not None:
            return self._logprobs(self.reference, batch, temperature)
        with lora.reference_disabled(self.engine.module):
            return self._logprobs(self.engine, batch, temperature)

    def _pack(self, sequences: list[TrainSequence]) -> PackedBatch:
        config = self.config
        return pack(sequences, self.pad_id, config.pack_sequences, config.pack_row_tokens, config.share_prefixes,
                    tree_tokens(sequences, config.max_tokens_per_micro_batch))

    def _set_lr(self, lr: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = lr * group.get("lr_scale", 1.0)

    def _inputs(self, causal_lm, batch: PackedBatch) -> dict:
        """`batch`'s inputs for `causal_lm`, under sdpa attention with its mask additive in the model's
        dtype (PackedBatch.model_inputs: one copy of it for all layers, not one per layer)."""
        sdpa = causal_lm.config._attn_implementation == "sdpa"
        return batch.model_inputs(self.engine.device, causal_lm.get_input_embeddings().weight.dtype if sdpa else None)

    def _logprobs(self, model, batch: PackedBatch, temperature: float = 1.0, entropy: bool = False, hidden=None):
        """Next-token logprobs at the sampler's temperature at the completion tokens (0 elsewhere),
        `learner.logit_chunk_tokens` tokens at a time (learner/logits.py); with `entropy`, also the
        masked sum of the next-token distributions' entropies (from the same logits). `hidden`: the
        model's final hidden states, already computed."""
        device = self.engine.device
        causal_lm = self.engine.module if model is self.engine else model
        if hidden is None:
            hidden = final_hidden_states(model, causal_lm, self._inputs(causal_lm, batch))
        out = chunked_logprobs(hidden, causal_lm.get_output_embeddings(), batch.input_ids, batch.completion_positions.to(device),
                               temperature, self.config.logit_chunk_tokens, entropy)
        if not entropy:
            return out.cpu()
        logprobs, entropies = out
        return logprobs.cpu(), (entropies.cpu() * batch.completion_mask).sum().item()

    def train_step(self, work: Work, loss_config: PolicyLoss, temperature: float, kl_coef: float,
                   lr: float | None = None) -> dict[str, float]:
        """Policy-gradient updates: one optimizer step per mini-batch of `work`, with the loss
        `loss_config` (learner.loss), logprobs at the samples' `temperature`, a KL penalty of
        weight `kl_coef` in the loss (0: none) and learning rate `lr` (None: learner.lr).

        Mini-batches after the first are slightly off-policy; the clipped ratio against the
        learner's logprobs at the start of the step accounts for it, and truncated importance
        sampling for the sampler's own difference (see policy_loss).
        """
        started = time.monotonic()
        self._begin_step(loss_config, temperature, kl_coef, lr)
        minis = [([self._pack(m) for m in micros], normalizer, tokens) for micros, normalizer, tokens in work]
        # The learner's logprobs before any update: the ratio's reference, and against the
        # sampler's logprobs the measure of the sampler/learner mismatch (kernels, precision,
        # stale weights), which truncated importance sampling corrects. With one mini-batch the
        # training forward runs on the step's starting weights: its own logprobs, detached, are
        # those, and a separate pass would compute them again (verl and TRL skip it too).
        separate_pass = len(minis) > 1 or self.step_start_pass_always
        step_start = []
        if separate_pass:
            with torch.no_grad():
                for micros, _, _ in minis:
                    step_start.append([])
                    for b in micros:
                        logprobs, entropy = self._logprobs(self.engine, b, temperature, entropy=True)
                        step_start[-1].append(logprobs)
                        self._open.entropy_sum += entropy
        else:
            step_start = [[None] * len(micros) for micros, _, _ in minis]
        totals: dict[str, float] = {}
        passes = sum(len(micros) for micros, _, _ in minis)
        for (micros, normalizer, tokens), olds in zip(minis, step_start):
            for batch, step_start_logprobs in zip(micros, olds):
                for key, value in self._micro_step(batch, step_start_logprobs, normalizer, tokens).items():
                    totals[key] = totals.get(key, 0.0) + value / passes
            self._apply_step()
        return self._end_step(totals, started)

    # A step in several calls (train.stream_groups): open_step, then stream_micro_batches as the
    # step's groups are scored, then close_step with what only the whole step knows (each
    # mini-batch's loss normalizer, the advantages' whitening divisor). The first mini-batch's
    # losses are backpropagated as sums and its gradients divided before its optimizer step:
    # exact where gradients are still whole on each rank before the step (ZeRO 0-1 in float32,
    # which the config requires), where a backward is also local, so that ranks may run different
    # numbers of passes. A later mini-batch's micro-batches get their step-start logprobs as they
    # come (train_step's separate pass) and train at the close, after the earlier steps.

    def open_step(self, loss_config: PolicyLoss, temperature: float, kl_coef: float, lr: float | None = None) -> None:
        """Start a step whose micro-batches come in several calls."""
        started = time.monotonic()
        self._begin_step(loss_config, temperature, kl_coef, lr)
        self._open.busy_s = time.monotonic() - started

    def stream_micro_batches(self, micros: list[list[TrainSequence]], mini: int = 0) -> None:
        """`micros` (each a micro-batch's sequences) of mini-batch `mini` of the open step: the
        first's forward and backward, the loss a sum (normalizer 1) until close_step; a later
        one's logprobs before any update, its training kept for close_step."""
        started = time.monotonic()
        step = self._open
        for seqs in micros:
            batch = self._pack(seqs)
            if mini == 0:
                for key, value in self._micro_step(batch, None, 1.0, None).items():
                    step.sums[key] = step.sums.get(key, 0.0) + value
                step.passes += 1
            else:
                with torch.no_grad():
                    logprobs, entropy = self._logprobs(self.engine, batch, step.temperature, entropy=True)
                step.entropy_sum += entropy
                step.later.append((mini, batch, logprobs))
        step.busy_s += time.monotonic() - started

    def close_step(self, normalizers: list[float | None], divisor: float = 1.0) -> dict[str, float]:
        """The open step's optimizer steps, one per mini-batch with sequences (`normalizers`: each
        mini-batch's over all ranks, as train_step's; None: it has none), the gradients divided by
        its normalizer and by `divisor`, what the batch's advantages were whitened by (every policy
        loss but its KL term is linear in a positive scale of the advantages; the config refuses a
        KL term with whitening); its statistics."""
        started = time.monotonic()
        step = self._open
        sums = step.sums
        for mini, normalizer in enumerate(normalizers):
            if normalizer is None:
                continue
            if mini == 0:
                sums["loss"] = sums.get("loss", 0.0) / (normalizer * divisor)
            for m, batch, logprobs in step.later:
                if m == mini:
                    for key, value in self._micro_step(batch, logprobs, normalizer * divisor, None).items():
                        sums[key] = sums.get(key, 0.0) + value
                    step.passes += 1
            for p in self.engine.module.parameters():
                if not p.requires_grad:
                    continue
                if p.grad is None:  # a rank given no micro-batch of it still joins the step's reduction
                    p.grad = torch.zeros_like(p)
                elif mini == 0:
                    p.grad.div_(normalizer * divisor)
            self._apply_step()
        totals = {key: value / max(step.passes, 1) for key, value in sums.items()}
        if "pg_loss" in totals:
            totals["pg_loss"] /= divisor
        return self._end_step(totals, started - step.busy_s)

    def _begin_step(self, loss_config: PolicyLoss, temperature: float, kl_coef: float, lr: float | None) -> None:
        self._set_lr(self.config.lr if lr is None else lr)
        self.engine.train()
        train_value = self.config.advantage.type == "ppo"
        if train_value and not self.shared_value:
            self._value_model().train()
        self._open = _Step(loss_config, temperature, kl_coef, train_value)

    def _micro_step(self, batch: PackedBatch, step_start_logprobs, normalizer: float, tokens: int | None) -> dict[str, float]:
        """Forward and backward of one micro-batch in the open step; its statistics. Without
        `step_start_logprobs` the training forward's own, detached, are the step start's."""
        step = self._open
        estimator = self.config.advantage
        reference_logprobs = None
        if step.kl_coef > 0:
            with torch.no_grad():
                reference_logprobs = self._reference_logprobs(batch, step.temperature)
        hidden = values = None
        if step.train_value and self.shared_value:  # one pass: the policy's hidden states and the head's values
            hidden, values = hidden_and_values(self.engine, self.engine.module, self._inputs(self.engine.module, batch))
        if step_start_logprobs is not None:
            logprobs = self._logprobs(self.engine, batch, step.temperature, hidden=hidden)
        else:
            logprobs, entropy = self._logprobs(self.engine, batch, step.temperature, entropy=True, hidden=hidden)
            step.entropy_sum += entropy
            step_start_logprobs = logprobs.detach()
        step.step_starts.append(step_start_logprobs)
        step.batches.append(batch)
        inputs = LossInputs(
            logprobs=logprobs, step_start_logprobs=step_start_logprobs,
            sampler_logprobs=batch.sampler_logprobs, advantages=batch.advantages, mask=batch.completion_mask,
            reference_logprobs=reference_logprobs, segments=batch.segments,
        )
        # DeepSpeed averages gradients over ranks: scale so that they sum instead.
        loss, stats = policy_loss(inputs, step.loss, step.kl_coef, self.config.kl.estimator if step.kl_coef > 0 else "k3",
                                  normalizer=normalizer / self.world_size)
        if step.train_value:
            # the mean over the mini-batch's trained tokens; PPO's clip against the step's start
            values = self._values(batch) if values is None else values.float().cpu()
            v_loss, v_stats = value_loss(values, batch.old_values, batch.returns, batch.completion_mask, estimator.value_clip,
                                         normalizer=tokens / self.world_size)
            stats.update(v_stats)
            if self.shared_value:
                loss = loss + estimator.value_loss_coef * v_loss
            else:
                self.value_engine.backward(v_loss.to(self.engine.device), scale_wrt_gas=False)
        self.engine.backward(loss.to(self.engine.device), scale_wrt_gas=False)
        stats["loss"] = loss.item()
        step.finite = step.finite and math.isfinite(stats["loss"])
        return stats

    def _apply_step(self) -> None:
        """The optimizer step of the mini-batch whose micro-batches the open step has run."""
        step = self._open
        norm, applied = self._step_engine(self.engine, step.finite)
        step.grad_norms.append(norm)
        step.skipped += not applied
        if step.train_value and not self.shared_value:
            step.value_grad_norm, value_applied = self._step_engine(self.value_engine, step.finite)
            step.skipped_value += not value_applied
        step.finite = True

    def _end_step(self, totals: dict[str, float], started: float) -> dict[str, float]:
        step, self._open = self._open, None
        if step.train_value and not self.shared_value:
            totals["value_grad_norm"] = step.value_grad_norm
            totals["skipped_value_steps"] = float(step.skipped_value)
        batches = step.batches
        diffs = torch.cat([(o - b.sampler_logprobs).abs()[b.completion_mask.bool()] for b, o in zip(batches, step.step_starts)]
                          + [torch.zeros(0)])
        totals["grad_norm"] = mean_norm(step.grad_norms)
        totals["skipped_optimizer_steps"] = float(step.skipped)
        totals["learner_rss_mb_max"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # this rank's peak so far
        totals["sampler_logprob_diff_sum"] = diffs.sum().item()
        totals["sampler_logprob_diff_max"] = diffs.max().item() if diffs.numel() else 0.0
        totals["tokens"] = float(diffs.numel())
        totals["entropy_sum"] = step.entropy_sum  # the policy's at the step's start, over the trained tokens
        totals["sequence_tokens_sum"] = float(sum(b.sequence_tokens for b in batches))
        totals["computed_tokens_sum"] = float(sum(b.computed_tokens for b in batches))
        totals["batch_tokens_sum"] = float(sum(b.input_ids.numel() for b in batches))  # padding included
        # What the step freed leaves the process before the push and the next step's rollouts need
        # memory: glibc keeps a fragmented heap's freed pages otherwise (a one-off measurement:
        # bench/results.md, "one-off measurements").
        return_free_memory()
        totals["busy_s_max"] = time.monotonic() - started  # this rank's time at the step's work
        return totals

    def token_stats(self, micros: list[list[TrainSequence]], temperature: float, kl_estimator: str | None,
                    values: bool) -> tuple[list | None, list | None]:
        """Before a step's advantages, per micro-batch and sequence, at each completion token: with
        `kl_estimator`, the KL estimate to the reference (a KL penalty in the reward); with `values`,
        the value model's estimate (PPO)."""
        kls, estimates = [] if kl_estimator else None, [] if values else None
        with torch.no_grad():
            if values and not self.shared_value:
                self._value_model().eval()
            for seqs in micros:
                batch = self._pack(seqs)
                if kl_estimator:
                    kl = kl_penalty(self._logprobs(self.engine, batch, temperature), self._reference_logprobs(batch, temperature), kl_estimator)
                    kls.append(batch.completion_rows(seqs, kl))
                if values:
                    estimates.append(batch.completion_rows(seqs, self._values(batch)))
        return kls, estimates

    def sft_step(self, work: Work, lr: float) -> dict[str, float]:
        """One optimizer step of next-token loss on the reference completions of `work`."""
        self._set_lr(lr)
        self.engine.train()
        total, skipped, norms = 0.0, 0, []
        for micros, normalizer, _ in work:
            finite = True
            for seqs in micros:
                batch = self._pack(seqs)
                loss = sft_loss(self._logprobs(self.engine, batch), batch.completion_mask, normalizer / self.world_size)
                self.engine.backward(loss.to(self.engine.device), scale_wrt_gas=False)
                total += loss.item() / self.world_size
                finite = finite and math.isfinite(total)
            norm, applied = self._step_engine(self.engine, finite)
            norms.append(norm)
            skipped += not applied
        return {"sft_loss_sum": total, "grad_norm": mean_norm(norms), "skipped_optimizer_steps": float(skipped)}

    def _step_engine(self, engine, finite: bool = True) -> tuple[float | None, bool]:
        """engine.step() unless a loss of the mini-batch (`finite` false on any rank) or the
        gradient is not finite: then the gradients are dropped and the weights stay as they were.
        Returns the gradient norm before clipping and whether the step was taken.

        Every rank decides alike (one all-reduce): ZeRO's step is a collective. Where gradients
        are still whole on each rank before the step (ZeRO 0-1) we check them ourselves; ZeRO-2/3
        reduce them into partitions during backward, and their step() finds a non-finite norm
        itself and discards the step, which we then read from the norm it reports (a non-finite
        loss gives non-finite gradients: the backward of NaN or inf is NaN).
        """
        grads = [p.grad for p in engine.module.parameters() if p.grad is not None]
        local = float(torch.nn.utils.get_total_norm(grads)) if grads else 0.0
        ok = every_rank(finite and math.isfinite(local), self.world_size)
        partitioned = self.config.zero_stage >= 2
        if not ok and not partitioned:
            engine.zero_grad()
            return local, False
        engine.step()
        # ZeRO optimizers report the norm of the reduced gradients; with a plain optimizer on
        # one rank the gradients are whole before the step and we measured them ourselves.
        reported = engine.get_global_grad_norm()
        norm = float(reported) if reported is not None else (local if self.world_size == 1 else None)
        return norm, ok and (norm is None or math.isfinite(norm))

    def _whole_parameters(self, trainable_only: bool = False):
        """ZeRO-3 keeps a shard of each parameter per rank: gather them to read whole weights
        (`trainable_only`: those that train, a LoRA adapter's).

        A collective: every rank must enter it together.
        """
        if self.config.zero_stage == 3:
            import deepspeed

            params = [p for p in self.engine.module.parameters() if p.requires_grad or not trainable_only]
            return deepspeed.zero.GatheredParameters(params, modifier_rank=None)
        return contextlib.nullcontext()

    def sync_forms(self) -> list[str]:
        """WeightSource: a LoRA policy with lora.sync adapter pushes its adapter (after the base
        under it when that is not the model's path: lora.start rl); otherwise whole weights."""
        if not (lora.is_peft(self.engine.module) and self.config.lora.sync == "adapter"):
            return ["weights"]
        return ["base", "adapter"] if self.config.lora.start == "rl" else ["adapter"]

    def adapter_config(self) -> dict | None:
        return lora.adapter_config(self.engine.module) if lora.is_peft(self.engine.module) else None

    @contextlib.contextmanager
    def weights_for_sync(self, form: str = "weights"):
        """A push of `form` (WeightSource; rank 0 sends it): the whole weights (a LoRA policy's
        merged), the base under the adapter, or the adapter's tensors alone."""
        if form == "adapter":
            with self._whole_parameters(trainable_only=True):
                yield lora.adapter_weights(self.engine.module)
            return
        with self._whole_parameters():
            yield named_weights(self.engine.module, base=form == "base")

    def parameter_counts(self) -> dict[str, int]:
        """Parameters of the policy, those that train, and the bytes of their optimizer state (this rank's)."""
        module = self.engine.module
        state = self.optimizer.state if hasattr(self.optimizer, "state") else {}
        optimizer_bytes = sum(t.numel() * t.element_size() for s in state.values() for t in s.values() if torch.is_tensor(t))
        return {"parameters": sum(p.ds_numel if hasattr(p, "ds_numel") else p.numel() for p in module.parameters()),
                "trainable": sum(p.ds_numel if hasattr(p, "ds_numel") else p.numel() for p in module.parameters() if p.requires_grad),
                "optimizer_state_bytes": optimizer_bytes}

    def save(self, path: str, with_state: bool = False) -> str:
        """Save the policy in Hugging Face format (loadable by `coderloo eval` and by vLLM); with
        LoRA, its adapter under `path/adapter` (PEFT's format), the merged model only with
        lora.merged_export, and with lora.start rl the adapter's base under `path/base`. With `with_state`, also DeepSpeed's state (optimizer, ZeRO partitions)
        under `path/deepspeed`."""
        Path(path).mkdir(parents=True, exist_ok=True)
        with self._whole_parameters():
            if self.rank == 0:
                module = self.engine.module
                if lora.is_peft(module):
                    lora.save(module, path, merged=self.config.lora.merged_export, base=self.config.lora.start == "rl")
                else:
                    # a shared value head is not part of the Hugging Face model (it is in the DeepSpeed state)
                    state = policy_state(module.state_dict()) if self.shared_value else None
                    module.save_pretrained(path, safe_serialization=True, state_dict=state)
                copy_tokenizer_files(self.model_path, path)
                if (Path(path) / lora.BASE_DIR).is_dir():
                    copy_tokenizer_files(self.model_path, Path(path) / lora.BASE_DIR)
        if with_state:
            if self.reference is not None and self.rank == 0:  # moved from model.path's weights by mix_reference
                self.reference.save_pretrained(Path(path) / REFERENCE_DIR, safe_serialization=True)
            self.engine.save_checkpoint(str(Path(path) / "deepspeed"), tag="state")
            if self.value_engine is not None:  # the separate value model, its optimizer and ZeRO state
                self.value_engine.save_checkpoint(str(Path(path) / "deepspeed_value"), tag="state")
        return path

    def load_state(self, path: str) -> None:
        """Restore weights and optimizer state saved by `save(path, with_state=True)` (and the
        separate value model's, when the checkpoint has it)."""
        load_path, _ = self.engine.load_checkpoint(str(Path(path) / "deepspeed"), tag="state")
        if load_path is None:
            raise FileNotFoundError(f"no DeepSpeed state under {path}/deepspeed")
        if self.reference is not None:
            reference_path = Path(path) / REFERENCE_DIR
            if not reference_path.exists():
                raise FileNotFoundError(f"learner.kl: no KL reference under {reference_path} (a checkpoint of a run without one)")
            self.reference = self._load_reference(reference_path).to(self.engine.device)
        if self.config.advantage.type == "ppo" and not self.shared_value:
            value_path = Path(path) / "deepspeed_value"
            if not value_path.exists():
                raise FileNotFoundError(f"learner.advantage ppo: no value model state under {value_path} "
                                        "(a checkpoint of a run without one)")
            load_path, _ = self._value_model().load_checkpoint(str(value_path), tag="state")
            if load_path is None:
                raise FileNotFoundError(f"no DeepSpeed state under {value_path}")
