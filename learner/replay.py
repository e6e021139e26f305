"""Reuse of high-advantage groups from earlier steps, through RLlib's prioritized replay buffer."""
from __future__ import annotations

from learner.batch import TrainSequence


class GroupReplay:
    """Priority: a group's mean absolute advantage. Replayed samples are off-policy; the clipped
    ratio and truncated importance sampling against their sampler's logprobs account for it."""

    def __init__(self, groups_per_step: int, capacity: int):
        from ray.rllib.utils.replay_buffers import PrioritizedReplayBuffer

        self.buffer = PrioritizedReplayBuffer(capacity=capacity, alpha=0.6)
        self.groups_per_step, self.capacity = groups_per_step, capacity
        self.store: dict[int, list[TrainSequence]] = {}
        self.added = 0

    def reuse(self, groups: list[list[TrainSequence]]) -> list[TrainSequence]:
        """Sequences of `groups_per_step` replayed groups; then `groups` join the buffer."""
        from ray.rllib.policy.sample_batch import SampleBatch

        replayed = []
        if len(self.store) >= self.groups_per_step:
            sample = self.buffer.sample(self.groups_per_step, beta=0.4)
            replayed = [seq for key in sample["group"] for seq in self.store[int(key)]]
        for group in groups:
            self.store[self.added] = group
            priority = sum(sum(map(abs, s.advantages)) / max(len(s.advantages), 1) for s in group) / len(group)
            self.buffer.add(SampleBatch({"group": [self.added]}), weight=priority + 1e-6)
            self.store.pop(self.added - self.capacity, None)  # overwritten in the buffer
            self.added += 1
        return replayed
