"""train.stream_groups: a step's groups go into the learner as they are scored, and the run trains
as it does without (tests/test_learner_actor.py checks one step's weights)."""
import pytest

from coderloo.config import load_config
from coderloo.controller import train
from coderloo.metrics import read_metrics
from coderloo.stream import GroupStream, check_same
from coderloo.tasksets.synthetic import synthetic_suite
from learner.algorithm import build_batch, to_sequences
from learner.batch import TrainSequence
from test_algorithm import reward, trajectory, turn
from tests.rounding import grad_norm_rtol


def test_a_streamed_run_trains_as_the_same_run_does_with_the_whole_batch(ray_cluster, tiny_model, tmp_path):
    """The asynchronous pipeline with and without streaming, the same seeds: the same samples, and
    the same updates (each step's gradient norm before clipping, with whitened advantages); the
    streamed steps reached the learner in several sends, the first before the step closed.
    (The updates differ by rounding, so a later step's samples could differ where a sampled
    uniform falls within rounding of a boundary of the sampler's distribution: of the order of the
    tokens sampled times the probabilities' rounding, about 400 x 1e-6 a run, left as it is.)"""
    steps = {}
    for streamed in (False, True):
        out = tmp_path / f"streamed-{streamed}"
        train(load_config("configs/default.yaml", [
            f"model.path={tiny_model}", f"train.output_dir={out}",
            "sft.steps=40", "sft.batch_size=16",  # programs that compile: groups whose outcomes differ
            "train.steps=3", "train.prompts_per_step=6", "train.eval_every=0", "train.checkpoint_every=0",
            "train.max_staleness=1", f"train.stream_groups={str(streamed).lower()}", "learner.optimizer_steps=1",
            "rollout.samples_per_prompt=4", "rollout.max_new_tokens=16",
            "learner.advantage.filter_uninformative=false",  # every group trains, even all-fail ones
            "tasks.max_eval_tasks=4", "eval.sampled=false",
        ]))
        steps[streamed] = [r for r in read_metrics(out / "metrics.jsonl") if r["phase"] == "rl"]
    whole, streamed = steps[False], steps[True]
    assert [r["step"] for r in streamed] == [1, 2, 3]
    for a, b in zip(whole, streamed):
        assert b["reward_mean"] == a["reward_mean"] and b["samples"] == a["samples"] == 24
        # other micro-batches: the same reductions over the step's tokens in other orders (tests/rounding.py)
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=grad_norm_rtol(a["learner_tokens"]))
        assert b["tokens"] == a["tokens"]
        assert b["time_learner_busy_s"] > 0 and 0 <= b["learner_idle_fraction"] <= 1
        assert 1 <= b["stream_sends"] <= 6 and b["time_stream_lead_s"] >= 0
        assert "stream_sends" not in a
    assert any(r["stream_sends"] > 1 for r in streamed)
    assert sum(r["grad_norm"] > 0 for r in whole) >= 2  # steps that learned something


def test_streamed_sequences_that_are_not_the_batchs_stop_the_step():
    """check_same compares what was streamed (advantages before whitening) with the step's batch."""
    def seq(completion, advantage):
        return TrainSequence([1, 2], completion, [-1.0] * len(completion), [advantage] * len(completion))

    sent = [seq([3, 4], 2.0), seq([5], -2.0)]
    check_same(sent, [seq([5], -1.0), seq([3, 4], 1.0)], divisor=2.0)  # another order, whitened by 2
    for batch, divisor in [([seq([5], -1.0), seq([3, 4], 1.0)], 1.0),  # not whitened by what was streamed
                           ([seq([3, 4], 1.0)], 2.0),  # a sequence the batch lacks
                           ([seq([5], -1.0), seq([3, 5], 1.0)], 2.0)]:  # another completion
        with pytest.raises(RuntimeError, match="train.stream_groups: the 2 sequences streamed into the step are not the"):
            check_same(sent, batch, divisor)


class RecordingLearner:
    """LearnerGroup's streaming calls, recorded (pure logic: what GroupStream sends, in what
    mini-batch, and what it closes with); `busy` as told."""

    def __init__(self):
        self.calls, self.is_busy = [], False

    def open_step(self, loss, temperature, kl_coef, lr=None):
        self.calls.append(("open", lr))

    def stream(self, sequences, mini=0):
        self.calls.append(("stream", mini, [s.completion_ids[0] for s in sequences]))

    def busy(self):
        return self.is_busy

    def close_step(self, minis, aggregation, max_new_tokens, divisor):
        self.calls.append(("close", [[s.completion_ids[0] for s in m] for m in minis], divisor))
        return {}


def test_groups_stream_as_they_are_scored_into_the_mini_batch_of_their_task_gathered_while_the_learner_is_busy():
    """optimizer_steps 2, 4 tasks: the groups of the first 2 tasks are the first mini-batch and the
    others the second, whatever order they were scored in; a uniform group (filtered) sends nothing;
    what arrives while the learner is busy waits and goes in one send per mini-batch; the step opens
    at its learning rate; the close gets each mini-batch's sequences and the batch's whitening
    divisor, after checking them against the batch's."""
    config = load_config("configs/default.yaml", ["train.stream_groups=true", "train.prompts_per_step=4", "rollout.samples_per_prompt=2",
                                                  "learner.warmup_steps=4"])
    tasks = synthetic_suite()["train"][:4]
    groups = [[trajectory(tasks[g], turn(2, reward(r), start=10 * g + j)) for j, r in enumerate(row)]  # completions start at 10g + j
              for g, row in enumerate([[1.0, 0.0], [0.0, 0.0], [0.0, 1.0], [1.0, 0.5]])]
    learner = RecordingLearner()
    stream = GroupStream(learner, config, step=1, tasks=4)
    stream.add(2, groups[2])  # scored first: sent at once, the second mini-batch's
    learner.is_busy = True
    stream.add(0, groups[0])  # waits
    stream.add(1, groups[1])  # uniform: filtered out
    stream.add(3, groups[3])  # waits
    batch = build_batch(to_sequences(groups), config.learner, 1)
    stream.close(batch, batch.sequences)
    assert config.learner.lr_at(1) == config.learner.lr / 4  # the step's rate, warming up
    assert learner.calls == [("open", config.learner.lr_at(1)), ("stream", 1, [20, 21]), ("stream", 0, [0, 1]), ("stream", 1, [30, 31]),
                             ("close", [[0, 1], [20, 21, 30, 31]], batch.divisor)]
    assert batch.divisor != 1.0  # whitened: the close divides by it
