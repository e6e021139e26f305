"""The learner's ranks as one object: create them, split each step among them, merge statistics."""
from __future__ import annotations

import contextlib
import time

import ray

from common.memory import oom_kills
from common.placement import placement_options
from common.progress import working
from learner.actor import Learner, Work
from learner.batch import TrainSequence, layout, tree_tokens
from learner.config import PolicyLoss
from learner.losses import loss_normalizer
from learner.packing import deal_to_ranks, split_even


class LearnerError(RuntimeError):
    """A learner rank died or stopped answering; the message names it, what it was doing and what to change."""


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
        self.cgroups = ray.get([r.memory_cgroup.remote() for r in self.ranks])
        self.oom_kills_before = [oom_kills(c) if c else 0 for c in self.cgroups]  # a resumed run's ranks reuse their cgroups

    # --- splitting work ---

    def _deal(self, sequences: list[TrainSequence], mini_batches: int, aggregation: str, max_new_tokens: int = 0) -> list[Work]:
        """Each rank's micro-batches of each mini-batch, with the mini-batch's normalizer and trained tokens."""
        work: list[Work] = [[] for _ in self.ranks]
        for mini in split_even(sequences, mini_batches):
            tokens = [trained_tokens(s) for s in mini]
            normalizer = loss_normalizer(aggregation, tokens, max_new_tokens)
            for rank, micros in enumerate(self._micro_batches(mini)):
                work[rank].append(([[mini[i] for i in m] for m in micros], normalizer, max(sum(tokens), 1)))
        return work

    def _micro_batches(self, sequences: list[TrainSequence], ranks: int = 0) -> list[list[list[int]]]:
        """Per rank (of `ranks`, all by default), its micro-batches of `sequences` (indices), a tree
        of shared prefixes (learner.share_prefixes) never split between two."""
        config, ranks = self.config, ranks or len(self.ranks)
        cap = tree_tokens(sequences, config.max_tokens_per_micro_batch)
        trees = layout(sequences, config.share_prefixes, cap)
        while len(trees) < ranks and cap > 1:  # every rank needs a tree
            cap //= 2
            trees = layout(sequences, config.share_prefixes, cap)
        dealt = deal_to_ranks([len(t.tokens) for t in trees], config.max_tokens_per_micro_batch, ranks,
                              config.pack_sequences, config.pack_row_tokens)
        return [[sorted(i for t in m for i in trees[t].members) for m in micros] for micros in dealt]

    # --- steps ---

    def train_step(self, sequences: list[TrainSequence], loss: PolicyLoss, temperature: float, kl_coef: float,
                   max_new_tokens: int, lr: float | None = None) -> dict[str, float]:
        """One RL step: the ranks apply `loss` (learner.loss) to `sequences` (with their per-token
        advantages) drawn at `temperature` with at most the rollout's `max_new_tokens`, with a KL
        penalty of weight `kl_coef` in the loss (0: none), at learning rate `lr` (None: learner.lr)."""
        work = self._deal(sequences, self.config.optimizer_steps, loss.aggregation, max_new_tokens)
        return merge_stats(self._wait([r.train_step.remote(w, loss, temperature, kl_coef, lr) for r, w in zip(self.ranks, work)], "train_step"))

    def open_step(self, loss: PolicyLoss, temperature: float, kl_coef: float, lr: float | None = None) -> None:
        """Start a step whose sequences come in several `stream` calls as its groups are scored
        (train.stream_groups); train_step's arguments but the sequences."""
        self.streamed = [r.open_step.remote(loss, temperature, kl_coef, lr) for r in self.ranks]  # the step's calls
        self.turn = 0  # the rank the next send begins with

    def stream(self, sequences: list[TrainSequence], mini: int = 0) -> None:
        """Hand `sequences` (whole groups, their advantages before whitening) of mini-batch `mini`
        to the open step: laid out in micro-batches and dealt to the ranks as train_step does (fewer
        sequences than ranks: to as many ranks, taking turns), run in the order they come; returns
        at once. With ZeRO 0-1 a backward is local, so ranks need not run the same number of passes."""
        n = min(len(self.ranks), len(sequences))
        for j, micros in enumerate(self._micro_batches(sequences, n)):
            rank = self.ranks[(self.turn + j) % len(self.ranks)]
            self.streamed.append(rank.stream_micro_batches.remote([[sequences[i] for i in m] for m in micros], mini))
        self.turn += n

    def busy(self) -> bool:
        """Whether a rank has streamed work it has not finished (every call is kept until the close,
        which surfaces one that failed)."""
        return bool(ray.wait(self.streamed, num_returns=len(self.streamed), timeout=0)[1]) if self.streamed else False

    def close_step(self, minis: list[list[TrainSequence]], aggregation: str, max_new_tokens: int, divisor: float) -> dict[str, float]:
        """The open step's optimizer steps: `minis` are the sequences streamed into each of its
        mini-batches, for their normalizers, and `divisor` what the batch's advantages were
        whitened by (they were streamed before it was known)."""
        normalizers = [loss_normalizer(aggregation, [trained_tokens(s) for s in mini], max_new_tokens) if mini else None
                       for mini in minis]
        pending, self.streamed = self.streamed, []
        closed = self._wait(pending + [r.close_step.remote(normalizers, divisor) for r in self.ranks], "train_step")
        return merge_stats(closed[len(pending):])

    def sft_step(self, examples: list[tuple[list[int], list[int]]]) -> dict[str, float]:
        """One optimizer step of next-token loss (token mean) on (prompt ids, completion ids) pairs."""
        work = self._deal([TrainSequence(p, c) for p, c in examples], 1, "token_mean")
        results = self._wait([r.sft_step.remote(w, self.sft_lr) for r, w in zip(self.ranks, work)], "sft_step")
        return {"sft_loss": sum(r["sft_loss_sum"] for r in results), "grad_norm": results[0]["grad_norm"],
                "skipped_optimizer_steps": results[0]["skipped_optimizer_steps"]}

    def token_stats(self, sequences: list[TrainSequence], temperature: float, kl: bool, values: bool
                    ) -> tuple[list[list[float]] | None, list[list[float]] | None]:
        """Per sequence, at each completion token: with `kl`, the KL estimate to the reference (a KL
        penalty in the reward); with `values`, the value model's estimate (PPO). None where not asked."""
        dealt = self._micro_batches(sequences)
        results = self._wait([r.token_stats.remote([[sequences[i] for i in m] for m in micros], temperature,
                                                    self.config.kl.estimator if kl else None, values)
                              for r, micros in zip(self.ranks, dealt)], "token_stats")
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

    def mix_reference(self, mix: float) -> None:
        """The KL reference moves towards the policy by `mix` (Learner.mix_reference; 1: becomes it)."""
        self._wait([r.mix_reference.remote(mix) for r in self.ranks], "mix_reference")

    def parameter_counts(self) -> dict[str, int]:
        """The policy's parameters, those that train and rank 0's optimizer-state bytes (Learner.parameter_counts)."""
        return ray.get(self.ranks[0].parameter_counts.remote())

    def save(self, path: str, with_state: bool = False) -> None:
        self._wait([r.save.remote(path, with_state) for r in self.ranks], "save")

    def load_state(self, path: str) -> None:
        self._wait([r.load_state.remote(path) for r in self.ranks], "load_state")

    def check_alive(self, during: str) -> None:
        """Raise LearnerError (as a call would) if a rank died `during` something that is not a learner call."""
        self._wait([r.memory_cgroup.remote() for r in self.ranks], during)

    def _wait(self, refs: list, what: str) -> list:
        """Each rank's answer to `what`, in rank order. A rank that dies (or raises) ends the wait at
        once: the others would wait for it in their next collective until gloo's or NCCL's own
        timeout (30 minutes). A call that no rank finishes within learner.step_timeout_s is a hang
        (a collective that a stopped or lost rank never joins): every rank is killed and
        LearnerError says which ranks had not answered."""
        deadline = time.monotonic() + self.config.step_timeout_s
        pending = list(refs)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1, timeout=max(deadline - time.monotonic(), 0))
            if not ready:
                late = [f"rank {refs.index(r)}" for r in pending]
                self.kill()
                raise LearnerError(
                    f"learner {', '.join(late)} did not finish {what} within learner.step_timeout_s={self.config.step_timeout_s:g} s: "
                    "stuck (a collective that another rank never joined, or a stopped process); the learner was stopped. "
                    "Raise learner.step_timeout_s if a step of this size takes longer.")
            try:
                ray.get(ready[0])
            except ray.exceptions.RayActorError as e:
                rank = refs.index(ready[0])
                self.kill()
                oom = self.cgroups[rank] is not None and oom_kills(self.cgroups[rank]) > self.oom_kills_before[rank]  # read on this node
                raise LearnerError(f"learner rank {rank} died during {what}: {died_because(e, self.config, oom)}") from e
            except ray.exceptions.RayTaskError:
                self.kill()
                raise
        return ray.get(refs)

    def kill(self) -> None:
        for r in self.ranks:
            ray.kill(r)


def died_because(error: ray.exceptions.RayActorError, config, oom: bool) -> str:
    """Why a rank died (Ray's words), and what to change when it was killed for memory."""
    said = " ".join(str(error).split())[:800]
    if not oom:
        return said
    return (f"the kernel killed it for memory: it outgrew learner.memory_limit_mb={config.memory_limit_mb:g} MiB. Lower "
            "learner.max_tokens_per_micro_batch, use a higher learner.zero_stage or more learner.num_ranks, or raise "
            f"learner.memory_limit_mb. (Ray: {said})")


def merge_stats(results: list[dict[str, float]]) -> dict[str, float]:
    """Means over ranks, except sums and maxima that are merged as such."""
    merged = {}
    for key in dict.fromkeys(k for r in results for k in r):  # a streamed step's rank may have had no pass
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
    # the step's learner tokens: computed (the trees' columns) and in the tensors (padding included)
    merged["learner_tokens"] = merged.pop("batch_tokens_sum")
    computed = merged.pop("computed_tokens_sum")
    merged["padding_share"] = 1.0 - computed / max(merged["learner_tokens"], 1.0)
    merged["shared_prefix_share"] = 1.0 - computed / max(merged.pop("sequence_tokens_sum"), 1.0)
    merged["grad_norm"] = results[0]["grad_norm"]
    merged["time_learner_busy_s"] = merged.pop("busy_s_max")  # the busiest rank's time at the step
    return merged


def trained_tokens(sequence: TrainSequence) -> int:
    return len(sequence.completion_ids) if sequence.mask is None else sum(sequence.mask)
