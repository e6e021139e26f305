"""A CodeRL-style critic: predicts a program's outcome class from its tokens, trained online.

The critic is a model of its own, as CodeRL's is: a transformer backbone (the policy after its SFT
warm-up, or the model's path: critic.start; it reads code with the policy's tokenizer and its
features) and a linear head over four outcome classes, fine-tuned whole (critic.backbone train;
frozen: the head alone, on features each program gets once) on the samples the sandbox scores, in
one CPU actor: cross-entropy on the classes and, with rank_coef, a ranking loss within each task's
group of k (a better outcome should score higher than a worse one of the same prompt), since cross-
entropy alone can learn which tasks pass without telling a task's own samples apart. Not a head on
the policy's hidden states: the policy's weights then serve the RL objective alone, the critic
trains while the learner does instead of in its step, and a run without a critic is unchanged.

Its features: the mean of the backbone's last hidden states at the completion's positions. Under
causal attention the prompt's positions never see the completion, and they are the same for all
k samples of a prompt, so pooling them would only dilute what tells the samples apart.
"""
from __future__ import annotations

import hashlib
import math
import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import ray
import torch
import torch.nn.functional as F

from learner.batch import TrainSequence, pack

STATE_FILE = "critic.pt"  # in a training checkpoint's directory
# CodeRL's four outcome classes; the caller labels each program with one of them.
OUTCOMES = ("syntax_error", "runtime_error", "failed", "passed")
PASSED = OUTCOMES.index("passed")

def accuracy(probs: np.ndarray, labels: np.ndarray) -> float | None:
    """Share of rows whose most probable class is the label; None without rows."""
    return float((probs.argmax(axis=1) == labels).mean()) if len(labels) else None


def auc(scores: np.ndarray, positive: np.ndarray) -> float | None:
    """Area under the ROC curve: the probability that a random positive scores above a random
    negative, ties counting one half (Mann-Whitney U from average ranks). None without both."""
    positive = np.asarray(positive, dtype=bool)
    n_pos, n_neg = int(positive.sum()), int((~positive).sum())
    if n_pos == 0 or n_neg == 0:
        return None
    _, inverse, counts = np.unique(scores, return_inverse=True, return_counts=True)
    ends = np.cumsum(counts)  # 1-based rank of the last member of each group of equal scores
    ranks = (ends - (counts - 1) / 2)[inverse]
    return float((ranks[positive].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def heldout_task(task_id: str, fraction: float) -> bool:
    """Whether the critic keeps a task's samples for measurement only: by task, not by sample,
    since the k samples of a prompt are alike and would leak into its training."""
    return int(hashlib.sha256(task_id.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF < fraction


@ray.remote
class Critic:
    """The critic's model and optimizer. `config` is a learner.config.CriticConfig."""

    def __init__(self, model_path: str, config, seed: int = 0):
        from common.hf import load_tokenizer

        torch.set_num_threads(config.threads)
        torch.manual_seed(seed)
        self.config = config
        self.rng = random.Random(seed)
        self.pad_id = load_tokenizer(model_path).pad_token_id
        self.start_from(model_path)

    def _logits(self, pairs: list[tuple[list[int], list[int]]]) -> torch.Tensor:
        if self.config.backbone == "train":
            return self.head(self._features(pairs))
        missing = list(dict.fromkeys(key for key in map(_key, pairs) if key not in self.features))
        missing.sort(key=lambda key: len(key[0]) + len(key[1]))  # batches of like lengths: little padding
        with torch.no_grad():  # a frozen backbone's features never change: each program's are computed once
            for i in range(0, len(missing), self.config.batch_size):
                chunk = missing[i : i + self.config.batch_size]
                self.features.update(zip(chunk, self._features([(list(p), list(c)) for p, c in chunk])))
        return self.head(torch.stack([self.features[_key(pair)] for pair in pairs]))

    def _features(self, pairs: list[tuple[list[int], list[int]]]) -> torch.Tensor:
        batch = pack([TrainSequence(p, c) for p, c in pairs], self.pad_id, packed=False)  # a row each: pooled per row
        hidden = self.backbone(**batch.model_inputs()).last_hidden_state
        # completion_mask marks the positions that predict completion tokens; one to the right
        # are the completion tokens themselves. An empty completion pools to zeros (the bias alone).
        mask = F.pad(batch.completion_mask, (1, 0)).unsqueeze(-1)
        return (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)

    def train_step(self, examples: list[tuple[list[int], list[int], int, str]]) -> dict[str, float]:
        """`config.steps_per_rl_step` optimizer steps on batches of (prompt ids, completion ids,
        outcome class, group) examples, whole groups drawn at random until a batch is full; the
        mean cross-entropy and ranking loss."""
        if not examples:
            return {}
        groups: dict[str, list] = {}
        for example in examples:
            groups.setdefault(example[3], []).append(example)
        self.backbone.train(self.config.backbone == "train")  # a frozen one's features as predict computes them
        losses, ranks = [], []
        for _ in range(self.config.steps_per_rl_step):
            batch = []
            for key in self.rng.sample(sorted(groups), len(groups)):
                if batch and len(batch) + len(groups[key]) > self.config.batch_size:
                    break
                batch += groups[key]
            logits = self._logits([(p, c) for p, c, _, _ in batch])
            labels = torch.tensor([y for _, _, y, _ in batch])
            loss = F.cross_entropy(logits, labels)
            rank = ranking_loss(logits, labels, [g for *_, g in batch])
            self.optimizer.zero_grad()
            (loss + self.config.rank_coef * rank).backward()
            self.optimizer.step()
            losses.append(loss.item())
            ranks.append(rank.item())
        return {"critic_loss": sum(losses) / len(losses), "critic_rank_loss": sum(ranks) / len(ranks)}

    def start_from(self, model_path: str) -> None:
        """A new backbone from `model_path` (a Hugging Face checkpoint of the same shape), a new head
        and optimizer: the critic starts there."""
        from transformers import AutoModel

        self.backbone = AutoModel.from_pretrained(model_path, dtype=torch.float32, local_files_only=True)
        self.head = torch.nn.Linear(self.backbone.config.hidden_size, len(OUTCOMES))
        frozen = self.config.backbone == "frozen"
        self.backbone.requires_grad_(not frozen)
        params = ([] if frozen else list(self.backbone.parameters())) + list(self.head.parameters())
        self.optimizer = torch.optim.AdamW(params, lr=self.config.lr, weight_decay=0.0)
        self.features: dict[tuple[tuple[int, ...], tuple[int, ...]], torch.Tensor] = {}  # a frozen backbone's, by program

    def save(self, path: str) -> None:
        """Weights, optimizer and sampling state into `path`/critic.pt (a training checkpoint)."""
        torch.save({"backbone": self.backbone.state_dict(), "head": self.head.state_dict(),
                    "optimizer": self.optimizer.state_dict(), "rng": self.rng.getstate(),
                    "torch_rng": torch.get_rng_state()}, Path(path) / STATE_FILE)

    def load(self, path: str) -> None:
        """Continue from what `save(path)` wrote."""
        state = torch.load(Path(path) / STATE_FILE, weights_only=True)
        self.backbone.load_state_dict(state["backbone"])
        self.features.clear()
        self.head.load_state_dict(state["head"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.rng.setstate(state["rng"])
        torch.set_rng_state(state["torch_rng"])

    @torch.no_grad()
    def predict(self, prompt_ids: list[list[int]], completion_ids: list[list[int]]) -> list[list[float]]:
        """Each pair's log-probability of each class in OUTCOMES: logs, so that a confident critic's
        programs stay ordered (in float32 its probabilities of passing round to 1 past a logit gap of
        about 17, and a pick among ties is no pick)."""
        self.backbone.eval()
        pairs = list(zip(prompt_ids, completion_ids, strict=True))
        size = self.config.batch_size
        return [row for i in range(0, len(pairs), size) for row in torch.log_softmax(self._logits(pairs[i : i + size]), dim=-1).tolist()]


def log_odds(log_probs: np.ndarray) -> np.ndarray:
    """The log-odds of passed from rows of log-probabilities of OUTCOMES: log P(passed) - log P(not)."""
    others = np.delete(log_probs, PASSED, axis=1)
    return log_probs[:, PASSED] - np.logaddexp.reduce(others, axis=1)


def _key(pair: tuple[list[int], list[int]]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    return tuple(pair[0]), tuple(pair[1])


def ranking_loss(logits: torch.Tensor, labels: torch.Tensor, groups: list[str]) -> torch.Tensor:
    """Mean over the pairs of one group whose classes differ of -log sigmoid(s_better - s_worse),
    s the log-odds of passed; the classes are ordered as OUTCOMES (a syntax error worst, a pass
    best). 0 when no pair differs."""
    log_p = torch.log_softmax(logits, dim=-1)
    score = log_p[:, PASSED] - torch.logsumexp(torch.cat([log_p[:, :PASSED], log_p[:, PASSED + 1:]], dim=1), dim=1)
    same = torch.tensor([[a == b for b in groups] for a in groups])
    better = (labels[:, None] > labels[None, :]) & same
    if not better.any():
        return logits.sum() * 0.0
    return F.softplus(score[None, :] - score[:, None])[better].mean()  # row i better than column j


def group_auc(scores: np.ndarray, positive: np.ndarray, groups: list[str]) -> float | None:
    """The mean over groups with passed and failed samples of the AUC within the group: how well
    the scores order a task's own samples (what picking among them needs). None without such a group."""
    by_group: dict[str, list[int]] = {}
    for i, g in enumerate(groups):
        by_group.setdefault(g, []).append(i)
    values = [auc(scores[rows], positive[rows]) for rows in by_group.values()]
    values = [v for v in values if v is not None]
    return float(np.mean(values)) if values else None


@dataclass
class CriticStep:
    """The critic's view of one RL step: its predictions, made before it learned from the step's
    samples, and the update it is making from them meanwhile."""

    log_probs: ray.ObjectRef
    training: ray.ObjectRef
    labels: list[int | None]
    heldout: list[bool]
    groups: list[str]

    def p_passed(self) -> list[float]:
        return [math.exp(row[PASSED]) for row in ray.get(self.log_probs)]

    def metrics(self) -> dict[str, float | None]:
        """Accuracy, and AUC of the log-odds of passed, on the held-out tasks' samples, over all of them
        and within each task's group, and the update's losses.

        Waits for the update, so that the critic's work never piles up behind a faster learner
        (and a failed update surfaces)."""
        keep = [i for i, (y, held) in enumerate(zip(self.labels, self.heldout)) if held and y is not None]
        log_probs = np.array(ray.get(self.log_probs)).reshape(-1, len(OUTCOMES))[keep]
        labels = np.array([self.labels[i] for i in keep], dtype=int)
        scores = log_odds(log_probs)
        return {
            "critic_accuracy": accuracy(log_probs, labels),
            "critic_auc": auc(scores, labels == PASSED),
            "critic_group_auc": group_auc(scores, labels == PASSED, [self.groups[i] for i in keep]),
            "critic_heldout_samples": len(keep),
            **ray.get(self.training),
        }


class OnlineCritic:
    """The controller's side of the critic: which tasks it never trains on, what it is sent each
    step, and predictions for evaluation. Its state is part of each training checkpoint."""

    def __init__(self, model_path: str, config, seed: int = 0, name: str | None = None):
        self.config = config
        self.actor = Critic.options(name=name).remote(model_path, config, seed)

    def observe(self, task_ids: list[str], prompt_ids: list[list[int]], completion_ids: list[list[int]],
                labels: list[int | None]) -> CriticStep:
        """Predict every program of a step, then train on those of the tasks not held out.
        `labels`: each program's index in OUTCOMES (None: no label, e.g. the sandbox failed).
        Returns at once."""
        heldout = [heldout_task(t, self.config.heldout_fraction) for t in task_ids]
        log_probs = self.actor.predict.remote(prompt_ids, completion_ids)  # an actor runs calls in order
        train = [(p, c, y, t) for p, c, y, t, held in zip(prompt_ids, completion_ids, labels, task_ids, heldout, strict=True)
                 if y is not None and not held]
        return CriticStep(log_probs, self.actor.train_step.remote(train), labels, heldout, task_ids)

    def log_odds(self, prompt_ids: list[list[int]], completion_ids: list[list[int]]) -> np.ndarray:
        """The log-odds of passed of each pair, for critic-guided selection (an order that a
        probability rounded to 1 would lose); P(passed) is its sigmoid."""
        return log_odds(np.array(ray.get(self.actor.predict.remote(prompt_ids, completion_ids))).reshape(-1, len(OUTCOMES)))

    def start_from(self, model_path: str | Path) -> None:
        ray.get(self.actor.start_from.remote(str(model_path)))

    def save(self, checkpoint: str | Path) -> None:
        ray.get(self.actor.save.remote(str(checkpoint)))

    def load(self, checkpoint: str | Path) -> None:
        if not (Path(checkpoint) / STATE_FILE).exists():
            raise FileNotFoundError(f"{checkpoint} has no {STATE_FILE}: it was written with critic.enabled false; "
                                    "resume with critic.enabled=false, or start a new run")
        ray.get(self.actor.load.remote(str(checkpoint)))

    def kill(self) -> None:
        ray.kill(self.actor)
