"""A step's groups streamed into the learner's micro-batches as they are scored (train.stream_groups).

The learner starts on the first scored group while the step's others are still generated and
scored. Each group's advantages are computed alone (the config allows only estimators that work
within a group); its sequences are sent to the ranks at once when they are idle, and gathered into
one send while they are busy (or until a micro-batch per rank is full). What only the whole step
knows, the loss's normalizer and the advantages' whitening divisor, divides the gradients before
the optimizer step (learner.actor.Learner.close_step), so the update is the one train_step makes on
the whole batch, up to float rounding (with several mini-batches, as long as no group is filtered
out: train_step splits the kept sequences evenly, a streamed step by task before it knows which
are kept): `close` checks that the streamed sequences are the batch's.
"""
from __future__ import annotations

import math
import time

from learner.algorithm import Batch, build_batch, to_sequences
from learner.batch import TrainSequence
from learner.group import LearnerGroup
from rollout_workers.types import Trajectory


class GroupStream:
    """Step `step`'s groups (of its `tasks` tasks) into `learner` as they come (`add`), its
    optimizer steps at `close`.

    With learner.optimizer_steps k, the groups of the step's first 1/k tasks (in the step's order,
    as train_step splits a batch) are its first mini-batch, backpropagated as they come; the
    others' logprobs at the step's start are taken as they come, and they train after the earlier
    steps (at the close). Which groups share a mini-batch does not depend on when they were scored.
    """

    def __init__(self, learner: LearnerGroup, config, step: int, tasks: int):
        self.learner, self.config, self.step, self.tasks = learner, config, step, tasks
        k = config.learner.optimizer_steps
        self.waiting: list[list[TrainSequence]] = [[] for _ in range(k)]  # by mini-batch, not sent yet: the ranks were busy
        self.sent: list[list[TrainSequence]] = [[] for _ in range(k)]
        self.opened = False
        self.sends, self.first_sent = 0, 0.0

    def add(self, index: int, group: list[Trajectory]) -> None:
        """The scored group of the step's task `index`: its kept sequences, with their advantages
        before whitening."""
        config, learn = self.config, self.config.learner
        samples = to_sequences([group], token_rewards=learn.dense_rewards, concat=config.env.train_as == "concat")
        alone = build_batch(samples, learn, self.step, max_new_tokens=config.rollout.max_new_tokens, turn_cost=config.env.turn_cost,
                            whitened=False)
        self.waiting[min(index * learn.optimizer_steps // self.tasks, learn.optimizer_steps - 1)] += alone.sequences
        self.pump()

    def pump(self, last: bool = False) -> None:
        """Send what waits if the ranks are idle, a micro-batch per rank is full, or nothing more will
        come; a send holds one mini-batch's sequences."""
        if not any(self.waiting):
            return
        learn = self.config.learner
        full = sum(len(s.prompt_ids) + len(s.completion_ids) for w in self.waiting for s in w) >= learn.max_tokens_per_micro_batch * learn.num_ranks
        if self.opened and not (last or full) and self.learner.busy():
            return
        if not self.opened:
            self.learner.open_step(learn.loss, self.config.rollout.temperature_at(self.step), learn.loss_kl_coef(self.step),
                                   learn.lr_at(self.step))
            self.opened, self.first_sent = True, time.time()
        for mini, sequences in enumerate(self.waiting):
            if sequences:
                self.learner.stream(sequences, mini)
                self.sends += 1
                self.sent[mini] += sequences
                self.waiting[mini] = []

    def close(self, batch: Batch, sequences: list[TrainSequence]) -> dict[str, float]:
        """The step's optimizer steps, once every group is in: `batch` is the whole step's (build_batch
        on its groups), `sequences` what it trains; {} when no group was kept (no step). Also how
        many sends the step's sequences took and how long before the close the learner had the first."""
        closing = time.time()
        self.pump(last=True)
        check_same([s for mini in self.sent for s in mini], sequences, batch.divisor)
        if not self.opened:
            return {}
        learn = self.config.learner
        stats = self.learner.close_step(self.sent, learn.loss.aggregation, self.config.rollout.max_new_tokens, batch.divisor)
        return {**stats, "stream_sends": self.sends, "time_stream_lead_s": closing - self.first_sent}


def check_same(sent: list[TrainSequence], batch: list[TrainSequence], divisor: float) -> None:
    """`sent` (advantages before whitening) are `batch`'s sequences (after it, by `divisor`), in any
    order: a difference is a bug in what may be streamed (coderloo.config's _stream_groups), never
    trained on. Two tasks may share a prompt and a completion with other advantages: the
    advantages are compared as a multiset per (prompt, completion, mask)."""
    def by_key(sequences: list[TrainSequence], scale: float) -> dict[tuple, list[list[float]]]:
        out: dict[tuple, list[list[float]]] = {}
        for s in sequences:
            out.setdefault((tuple(s.prompt_ids), tuple(s.completion_ids), tuple(s.mask or ())), []).append([a * scale for a in s.advantages])
        return {k: sorted(v) for k, v in out.items()}

    streamed, whole = by_key(sent, 1.0 / divisor), by_key(batch, 1.0)
    differ = [k for k in streamed.keys() | whole.keys() if len(streamed.get(k, [])) != len(whole.get(k, [])) or not all(
        len(a) == len(b) and all(math.isclose(x, y, rel_tol=1e-5, abs_tol=1e-6) for x, y in zip(a, b))
        for a, b in zip(streamed[k], whole[k]))]
    if differ:
        k = differ[0]
        raise RuntimeError(f"train.stream_groups: the {len(sent)} sequences streamed into the step are not the "
                           f"{len(batch)} of its batch; {len(differ)} (prompt, completion) pairs differ, the first streamed "
                           f"{len(streamed.get(k, []))} times with advantages {streamed.get(k, [])[:2]}, in the batch "
                           f"{len(whole.get(k, []))} times with {whole.get(k, [])[:2]} (whitening divisor {divisor:g}); "
                           "the step was not taken")
