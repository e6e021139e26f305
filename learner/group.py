"""The learner's ranks as one object: create them, split each step among them, merge statistics."""
from __future__ import annotations

import contextlib

import ray

from common.placement import placement_options
from common.progress import working
from learner.actor import Learner, Work
from learner.batch import TrainSequence
from learner.losses import LossConfig, loss_normalizer
from learner.packing import deal_to_ranks, split_even


class LearnerGroup:
    """`config.num_ranks` Learner actors forming one torch.distributed group (gloo on CPU, NCCL on GPU).

    Rank 0 is the weight source of the rollout group (the other ranks join ZeRO-3's gathers).
    """

    def __init__(self, model_path: str, config, sft_lr: float | None = None, name: str | None = None):
        self.config = config
        self.sft_lr = sft_lr or config.lr
        n = config.num_ranks
        options = placement_options(1 if config.device == "cuda" else 0, config.resources)
        self.ranks = [
            Learner.options(**options, name=f"coderloo-learner-{rank}-{name}" if name else None).remote(model_path, config, rank, n)
            for rank in range(n)
        ]
        addr, port = ray.get(self.ranks[0].rendezvous_address.remote())
        unbuilt = ray.get(self.ranks[0].unbuilt_ops.remote())
        # Every rank joins the group at once (init blocks until all have).
        setups = [r.setup.remote(addr, port) for r in self.ranks]
        with working(f"learner: compiling DeepSpeed's {', '.join(unbuilt)} (once per machine, about 2 min on 2 cores)") \
                if unbuilt else contextlib.nullcontext():
            ray.get(setups)

    # --- splitting work ---

    def _deal(self, sequences: list[TrainSequence], mini_batches: int, aggregation: str, max_new_tokens: int = 0) -> list[Work]:
        """Each rank's micro-batches of each mini-batch, with the mini-batch's normalizer and trained tokens."""
        work: list[Work] = [[] for _ in self.ranks]
        for mini in split_even(sequences, mini_batches):
            lengths = [len(s.prompt_ids) + len(s.completion_ids) for s in mini]
            tokens = [trained_tokens(s) for s in mini]
            normalizer = loss_normalizer(aggregation, tokens, max_new_tokens)
            for rank, micros in enumerate(deal_to_ranks(lengths, self.config.max_tokens_per_micro_batch, len(self.ranks))):
                work[rank].append(([[mini[i] for i in m] for m in micros], normalizer, max(sum(tokens), 1)))
        return work

    # --- steps ---

    def train_step(self, sequences: list[TrainSequence], loss: LossConfig) -> dict[str, float]:
        """One RL step: the ranks apply `loss` to `sequences` (with their per-token advantages)."""
        work = self._deal(sequences, self.config.optimizer_steps, loss.aggregation, loss.max_new_tokens)
        results = ray.get([r.train_step.remote(w, loss) for r, w in zip(self.ranks, work)])
        return merge_stats(results)

    def sft_step(self, examples: list[tuple[list[int], list[int]]]) -> dict[str, float]:
        """One optimizer step of next-token loss (token mean) on (prompt ids, completion ids) pairs."""
        work = self._deal([TrainSequence(p, c) for p, c in examples], 1, "token_mean")
        results = ray.get([r.sft_step.remote(w, self.sft_lr) for r, w in zip(self.ranks, work)])
        return {"sft_loss": sum(r["sft_loss_sum"] for r in results), "grad_norm": results[0]["grad_norm"]}

    def token_stats(self, sequences: list[TrainSequence], temperature: float, kl: bool, values: bool
                    ) -> tuple[list[list[float]] | None, list[list[float]] | None]:
        """Per sequence, at each completion token: with `kl`, the KL estimate to the reference (a KL
        penalty in the reward); with `values`, the value model's estimate (PPO). None where not asked."""
        lengths = [len(s.prompt_ids) + len(s.completion_ids) for s in sequences]
        dealt = deal_to_ranks(lengths, self.config.max_tokens_per_micro_batch, len(self.ranks))
        results = ray.get([r.token_stats.remote([[sequences[i] for i in m] for m in micros], temperature,
                                                self.config.kl_estimator if kl else None, values)
                           for r, micros in zip(self.ranks, dealt)])
        out: list[list[list[float]] | None] = [[[] for _ in sequences] if asked else None for asked in (kl, values)]
        for micros, per_rank in zip(dealt, results):
            for column, rows in zip(out, per_rank):
                if column is None:
                    continue
                for m, vs in zip(micros, rows):
                    for i, v in zip(m, vs):
                        column[i] = v
        return out[0], out[1]

    # --- weights and state ---

    @property
    def weight_sources(self) -> list:
        """For RolloutGroup.connect: rank 0 sends; the others take part in ZeRO-3's gathers."""
        return self.ranks

    def start_lora(self) -> None:
        """learner.lora.start rl: the adapter starts on the policy as it is now (Learner.start_lora)."""
        ray.get([r.start_lora.remote() for r in self.ranks])

    def parameter_counts(self) -> dict[str, int]:
        """The policy's parameters, those that train and rank 0's optimizer-state bytes (Learner.parameter_counts)."""
        return ray.get(self.ranks[0].parameter_counts.remote())

    def save(self, path: str, with_state: bool = False) -> None:
        ray.get([r.save.remote(path, with_state) for r in self.ranks])

    def load_state(self, path: str) -> None:
        ray.get([r.load_state.remote(path) for r in self.ranks])

    def kill(self) -> None:
        for r in self.ranks:
            ray.kill(r)


def merge_stats(results: list[dict[str, float]]) -> dict[str, float]:
    """Means over ranks, except sums and maxima that are merged as such."""
    merged = {}
    for key in results[0]:
        values = [r[key] for r in results if r.get(key) is not None]
        if not values:
            merged[key] = None
        elif key.endswith("_max"):
            merged[key] = max(values)
        elif key.endswith("_sum") or key == "tokens":
            merged[key] = sum(values)
        else:
            merged[key] = sum(values) / len(values)
    merged["sampler_logprob_diff_mean"] = merged.pop("sampler_logprob_diff_sum") / max(merged["tokens"], 1.0)
    merged["entropy"] = merged.pop("entropy_sum") / max(merged["tokens"], 1.0)
    merged["grad_norm"] = results[0]["grad_norm"]
    return merged


def trained_tokens(sequence: TrainSequence) -> int:
    return len(sequence.completion_ids) if sequence.mask is None else sum(sequence.mask)
