"""The DeepSpeed learner: a Ray actor that owns the policy, its optimizer and the reference model."""
from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

import ray
import torch

from coderloo.runtime import free_port
from learner.batch import PackedBatch, TrainSequence, micro_batches, pack
from learner.losses import policy_loss, sft_loss, token_logprobs
from rollout_workers.weight_sync import WeightSource


def named_weights(model) -> dict[str, torch.Tensor]:
    """The weights the rollout engines load, a tied embedding under both of its names.

    A receiver that maps lm_head to the embedding ignores the extra name; one that does not would
    otherwise keep a stale lm_head and sample from the old policy without any error.
    """
    named = {name: p.detach() for name, p in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        named["lm_head.weight"] = model.get_input_embeddings().weight.detach()
    return named


@ray.remote
class Learner(WeightSource):
    """One rank of the policy learner (a single rank on one machine).

    `config` is a coderloo.config.LearnerConfig; the learner knows nothing of sandboxes or HTTP.
    """

    def __init__(self, model_path: str, config, temperature: float, sft_lr: float | None = None):
        # Without the deepspeed launcher, DeepSpeed needs the torch.distributed rendezvous in env.
        os.environ.update(
            RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port())
        )
        import deepspeed

        from coderloo.models import load_causal_lm, load_tokenizer

        torch.manual_seed(config.seed)
        self.config = config
        self.model_path = model_path
        self.temperature = temperature
        self.tokenizer = load_tokenizer(model_path)
        self.pad_id = self.tokenizer.pad_token_id
        model = load_causal_lm(model_path)
        self.reference = None
        if config.kl_coef > 0:
            self.reference = load_causal_lm(model_path).eval().requires_grad_(False)
        optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
        ds_config = {
            "train_micro_batch_size_per_gpu": 1,  # batches are packed by us; the count is informational
            "gradient_accumulation_steps": config.grad_accum_steps,
            "gradient_clipping": config.max_grad_norm,
            "zero_optimization": {"stage": config.zero_stage},
            "bf16": {"enabled": config.dtype == "bfloat16"},
            "steps_per_print": 10**9,
        }
        self.engine, self.optimizer, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=ds_config)
        self.sft_lr = sft_lr
        self.grad_norm: float | None = None

    def _set_lr(self, lr: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def _logprobs(self, model, batch: PackedBatch) -> torch.Tensor:
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
        return token_logprobs(logits, batch.input_ids, self.temperature)

    def train_step(self, sequences: list[TrainSequence]) -> dict[str, float]:
        """Policy-gradient updates over one batch of samples.

        The batch is split into `optimizer_steps` mini-batches, each one optimizer step of
        `grad_accum_steps` micro-batches. Mini-batches after the first are slightly off-policy;
        the clipped ratio against the learner's logprobs at the start of the step accounts for
        it, and truncated importance sampling for the sampler's own difference (see policy_loss).
        """
        self._set_lr(self.config.lr)
        self.engine.train()
        totals: dict[str, float] = {}
        count = self.config.optimizer_steps * self.config.grad_accum_steps
        chunks = [
            pack(chunk, self.pad_id)
            for mini in micro_batches(sequences, self.config.optimizer_steps)
            for chunk in micro_batches(mini, self.config.grad_accum_steps)
        ]
        # The learner's logprobs before any update: the ratio's reference, and against the
        # sampler's logprobs the measure of the sampler/learner mismatch (kernels, precision,
        # stale weights), which truncated importance sampling corrects.
        with torch.no_grad():
            old = [self._logprobs(self.engine, batch) for batch in chunks]
        diffs = torch.cat([((o - b.old_logprobs).abs())[b.completion_mask.bool()] for o, b in zip(old, chunks)])
        for batch, old_logprobs in zip(chunks, old):
            logprobs = self._logprobs(self.engine, batch)
            ref_logprobs = None
            if self.reference is not None:
                with torch.no_grad():
                    ref_logprobs = self._logprobs(self.reference, batch)
            loss, stats = policy_loss(
                logprobs,
                old_logprobs,
                batch.advantages,
                batch.completion_mask,
                clip_eps=self.config.clip_eps,
                ref_logprobs=ref_logprobs,
                kl_coef=self.config.kl_coef,
                sampler_logprobs=batch.old_logprobs,
                tis_cap=self.config.tis_cap,
            )
            self.engine.backward(loss)
            self._step()
            stats["loss"] = loss.item()
            for key, value in stats.items():
                totals[key] = totals.get(key, 0.0) + value / count
        totals["grad_norm"] = self.grad_norm
        totals["sampler_logprob_diff_mean"] = diffs.mean().item() if diffs.numel() else 0.0
        totals["sampler_logprob_diff_max"] = diffs.max().item() if diffs.numel() else 0.0
        return totals

    def sft_step(self, examples: list[tuple[list[int], list[int]]]) -> dict[str, float]:
        """One optimizer step of next-token loss on (prompt_ids, completion_ids) pairs."""
        self._set_lr(self.sft_lr or self.config.lr)
        self.engine.train()
        # micro_batches refuses fewer examples than micro-batches: DeepSpeed steps the optimizer only
        # every grad_accum_steps micro-batches, and a short step would leak into the next one.
        chunks = micro_batches(examples, self.config.grad_accum_steps)
        total = 0.0
        for chunk in chunks:
            seqs = [TrainSequence(p, c, [0.0] * len(c), 0.0) for p, c in chunk]
            batch = pack(seqs, self.pad_id)
            loss = sft_loss(self._logprobs(self.engine, batch), batch.completion_mask)
            self.engine.backward(loss)
            self._step()
            total += loss.item() / len(chunks)
        return {"sft_loss": total, "grad_norm": self.grad_norm}

    def _step(self) -> None:
        """engine.step(), recording the gradient norm (before clipping) at an optimizer step."""
        if self.engine.is_gradient_accumulation_boundary():
            # ZeRO-2/3 optimizers report the norm of their partitioned gradients; with a plain
            # optimizer (ZeRO 0/1) the gradients are whole here and we measure them ourselves.
            grads = [p.grad for p in self.engine.module.parameters() if p.grad is not None]
            own = float(torch.nn.utils.get_total_norm(grads)) if grads else None
            self.engine.step()
            reported = self.engine.get_global_grad_norm()
            self.grad_norm = float(reported) if reported is not None else own
        else:
            self.engine.step()

    def _whole_parameters(self):
        """ZeRO-3 keeps a shard of each parameter per rank: gather them to read whole weights."""
        if self.config.zero_stage == 3:
            import deepspeed

            return deepspeed.zero.GatheredParameters(list(self.engine.module.parameters()), modifier_rank=None)
        return contextlib.nullcontext()

    def state_dict(self) -> dict[str, torch.Tensor]:
        """A copy of the whole weights (tests and checkpoints read them)."""
        with self._whole_parameters():
            return {name: t.clone() for name, t in named_weights(self.engine.module).items()}

    @contextlib.contextmanager
    def weights_for_sync(self):
        """Whole weights for the rollout engines (WeightSource: rank 0 sends them)."""
        with self._whole_parameters():
            yield named_weights(self.engine.module)

    def save(self, path: str) -> str:
        """Save the policy in Hugging Face format, loadable by `coderloo eval` and by vLLM."""
        Path(path).mkdir(parents=True, exist_ok=True)
        with self._whole_parameters():
            self.engine.module.save_pretrained(path, safe_serialization=True)
        # Copy the tokenizer files as they are: re-saving through a loaded class can change them.
        for name in os.listdir(self.model_path):
            if name.startswith("tokenizer") or name in ("special_tokens_map.json", "vocab.json", "merges.txt"):
                shutil.copy(Path(self.model_path) / name, Path(path) / name)
        return path
