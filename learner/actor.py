"""The DeepSpeed learner: one Ray actor per rank; the ranks form one torch.distributed group.

`learner.group.LearnerGroup` creates the ranks, deals each step's micro-batches to them and
merges their statistics. Each rank runs the same number of forward/backward passes per optimizer
step (ZeRO reduces gradients at each backward); gradients are accumulated by us over a variable
number of token-budget micro-batches (DeepSpeed's unmanaged gradient accumulation), and every
loss is a sum over tokens divided by a normalizer of the whole mini-batch across ranks, so the
gradient does not depend on how the batch was split.
"""
from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

import ray
import torch

from common.weight_sync import WeightSource
from learner.batch import PackedBatch, TrainSequence, pack
from learner.losses import LossConfig, LossInputs, kl_penalty, policy_loss, sft_loss, token_logprobs, token_logprobs_and_entropy

# The op DeepSpeed compiles for its collectives on CPU when the first engine starts on a node.
SHM_COMM_OP = "deepspeed_shm_comm"

# One rank's share of a step: for each mini-batch (optimizer step), its micro-batches and the
# normalizer of the whole mini-batch (over all ranks).
Work = list[tuple[list[list[TrainSequence]], float]]


def named_weights(model) -> dict[str, torch.Tensor]:
    """The weights the rollout engines load, a tied embedding under both of its names.

    A receiver that maps lm_head to the embedding ignores the extra name; one that does not would
    otherwise keep a stale lm_head and sample from the old policy without any error.
    """
    named = {name: p.detach() for name, p in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        named["lm_head.weight"] = model.get_input_embeddings().weight.detach()
    return named


def copy_tokenizer_files(model_path: str | Path, out: str | Path) -> None:
    """Copy the tokenizer files as they are: re-saving through a loaded class can change them."""
    for name in os.listdir(model_path):
        if name.startswith("tokenizer") or name in ("special_tokens_map.json", "vocab.json", "merges.txt"):
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
        self.model_path = model_path
        self.config = config
        self.rank = rank
        self.world_size = world_size

    def rendezvous_address(self) -> tuple[str, int]:
        from common.placement import node_address_and_port

        return node_address_and_port()

    def unbuilt_ops(self) -> list[str]:
        """The DeepSpeed ops `setup` compiles on this node first (minutes; once per machine)."""
        from torch.utils.cpp_extension import _get_build_directory

        names = [SHM_COMM_OP] if self.config.device == "cpu" else []  # DeepSpeed's CPU collectives
        return [n for n in names if not (Path(_get_build_directory(n, verbose=False)) / f"{n}.so").exists()]

    def setup(self, master_addr: str, master_port: int) -> None:
        # Without the deepspeed launcher, DeepSpeed reads the rendezvous from the environment.
        os.environ.update(
            RANK=str(self.rank), WORLD_SIZE=str(self.world_size), LOCAL_RANK="0",
            MASTER_ADDR=master_addr, MASTER_PORT=str(master_port),
        )
        import deepspeed

        from common.hf import load_causal_lm, load_tokenizer

        config = self.config
        torch.manual_seed(config.seed)
        if config.device == "cpu":
            torch.set_num_threads(config.threads)
        accelerator = deepspeed.get_accelerator()
        backend = "gloo" if accelerator.device_name() == "cpu" else accelerator.communication_backend_name()
        deepspeed.init_distributed(dist_backend=backend, auto_mpi_discovery=False)
        self.tokenizer = load_tokenizer(self.model_path)
        self.pad_id = self.tokenizer.pad_token_id
        model = load_causal_lm(self.model_path)
        self.reference = None
        if config.kl_coef > 0 or (config.kl_coef_final or 0) > 0:
            # Frozen: in the training dtype (a float32 copy of a 7B model would take 30 GB per rank).
            self.reference = load_causal_lm(self.model_path, config.dtype).eval().requires_grad_(False)
        optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
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
        self.engine, self.optimizer, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=ds_config)
        if self.reference is not None:
            self.reference.to(self.engine.device)
        self.grad_norm: float | None = None

    def _set_lr(self, lr: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def _logprobs(self, model, batch: PackedBatch, temperature: float = 1.0, entropy: bool = False):
        """Next-token logprobs at the sampler's temperature; with `entropy`, also the masked sum of
        the next-token distributions' entropies (from the same logits: one micro-batch's at a time)."""
        device = self.engine.device
        logits = model(input_ids=batch.input_ids.to(device), attention_mask=batch.attention_mask.to(device)).logits
        if not entropy:
            return token_logprobs(logits, batch.input_ids.to(device), temperature).float().cpu()
        logprobs, entropies = token_logprobs_and_entropy(logits, batch.input_ids.to(device), temperature)
        return logprobs.float().cpu(), (entropies.float().cpu() * batch.completion_mask).sum().item()

    def train_step(self, work: Work, loss_config: LossConfig) -> dict[str, float]:
        """Policy-gradient updates: one optimizer step per mini-batch of `work`.

        Mini-batches after the first are slightly off-policy; the clipped ratio against the
        learner's logprobs at the start of the step accounts for it, and truncated importance
        sampling for the sampler's own difference (see policy_loss).
        """
        self._set_lr(self.config.lr)
        self.engine.train()
        temperature = loss_config.temperature
        minis = [([pack(m, self.pad_id) for m in micros], normalizer) for micros, normalizer in work]
        # The learner's logprobs before any update: the ratio's reference, and against the
        # sampler's logprobs the measure of the sampler/learner mismatch (kernels, precision,
        # stale weights), which truncated importance sampling corrects.
        with torch.no_grad():
            step_start, entropy_sum = [], 0.0
            for micros, _ in minis:
                step_start.append([])
                for b in micros:
                    logprobs, entropy = self._logprobs(self.engine, b, temperature, entropy=True)
                    step_start[-1].append(logprobs)
                    entropy_sum += entropy
        diffs = torch.cat(
            [(o - b.sampler_logprobs).abs()[b.completion_mask.bool()] for (micros, _), olds in zip(minis, step_start) for b, o in zip(micros, olds)]
        )
        totals: dict[str, float] = {}
        passes = sum(len(micros) for micros, _ in minis)
        for (micros, normalizer), olds in zip(minis, step_start):
            for batch, step_start_logprobs in zip(micros, olds):
                reference_logprobs = None
                if loss_config.kl_coef > 0:
                    with torch.no_grad():
                        reference_logprobs = self._logprobs(self.reference, batch, temperature)
                inputs = LossInputs(
                    logprobs=self._logprobs(self.engine, batch, temperature), step_start_logprobs=step_start_logprobs,
                    sampler_logprobs=batch.sampler_logprobs, advantages=batch.advantages, mask=batch.completion_mask,
                    reference_logprobs=reference_logprobs,
                )
                # DeepSpeed averages gradients over ranks: scale so that they sum instead.
                loss, stats = policy_loss(inputs, loss_config, normalizer=normalizer / self.world_size)
                self.engine.backward(loss.to(self.engine.device), scale_wrt_gas=False)
                stats["loss"] = loss.item()
                for key, value in stats.items():
                    totals[key] = totals.get(key, 0.0) + value / passes
            self._step()
        totals["grad_norm"] = self.grad_norm
        totals["sampler_logprob_diff_sum"] = diffs.sum().item()
        totals["sampler_logprob_diff_max"] = diffs.max().item() if diffs.numel() else 0.0
        totals["tokens"] = float(diffs.numel())
        totals["entropy_sum"] = entropy_sum  # the policy's at the step's start, over the trained tokens
        return totals

    def sequence_kl(self, micros: list[list[TrainSequence]], temperature: float, estimator: str) -> list[list[float]]:
        """Per sequence, the sum over its completion tokens of the KL estimate to the reference."""
        out = []
        with torch.no_grad():
            for seqs in micros:
                batch = pack(seqs, self.pad_id)
                kl = kl_penalty(self._logprobs(self.engine, batch, temperature), self._logprobs(self.reference, batch, temperature), estimator)
                out.append((kl * batch.completion_mask).sum(dim=1).tolist())
        return out

    def sft_step(self, work: Work, lr: float) -> dict[str, float]:
        """One optimizer step of next-token loss on the reference completions of `work`."""
        self._set_lr(lr)
        self.engine.train()
        total = 0.0
        for micros, normalizer in work:
            for seqs in micros:
                batch = pack(seqs, self.pad_id)
                loss = sft_loss(self._logprobs(self.engine, batch), batch.completion_mask, normalizer / self.world_size)
                self.engine.backward(loss.to(self.engine.device), scale_wrt_gas=False)
                total += loss.item() / self.world_size
            self._step()
        return {"sft_loss_sum": total, "grad_norm": self.grad_norm}

    def _step(self) -> None:
        """engine.step() (the accumulation boundary), recording the gradient norm before clipping."""
        grads = [p.grad for p in self.engine.module.parameters() if p.grad is not None]
        own = float(torch.nn.utils.get_total_norm(grads)) if grads and self.world_size == 1 else None
        self.engine.step()
        # ZeRO optimizers report the norm of the reduced gradients; with a plain optimizer on
        # one rank the gradients are whole before the step and we measured them ourselves.
        reported = self.engine.get_global_grad_norm()
        self.grad_norm = float(reported) if reported is not None else own

    def _whole_parameters(self):
        """ZeRO-3 keeps a shard of each parameter per rank: gather them to read whole weights.

        A collective: every rank must enter it together.
        """
        if self.config.zero_stage == 3:
            import deepspeed

            return deepspeed.zero.GatheredParameters(list(self.engine.module.parameters()), modifier_rank=None)
        return contextlib.nullcontext()

    @contextlib.contextmanager
    def weights_for_sync(self):
        """Whole weights for the rollout engines (WeightSource: rank 0 sends them)."""
        with self._whole_parameters():
            yield named_weights(self.engine.module)

    def save(self, path: str, with_state: bool = False) -> str:
        """Save the policy in Hugging Face format (loadable by `coderloo eval` and by vLLM); with
        `with_state`, also DeepSpeed's state (optimizer, ZeRO partitions) under `path/deepspeed`."""
        Path(path).mkdir(parents=True, exist_ok=True)
        with self._whole_parameters():
            if self.rank == 0:
                self.engine.module.save_pretrained(path, safe_serialization=True)
                copy_tokenizer_files(self.model_path, path)
        if with_state:
            self.engine.save_checkpoint(str(Path(path) / "deepspeed"), tag="state")
        return path

    def load_state(self, path: str) -> None:
        """Restore weights and optimizer state saved by `save(path, with_state=True)`."""
        load_path, _ = self.engine.load_checkpoint(str(Path(path) / "deepspeed"), tag="state")
        if load_path is None:
            raise FileNotFoundError(f"no DeepSpeed state under {path}/deepspeed")
