"""The `coderloo` command: train, eval, tasks."""
from __future__ import annotations

import argparse
import json
import sys

from coderloo.config import ConfigError, load_config
from coderloo.runtime import apply_env_defaults


def _config(args):
    return load_config(args.config, args.overrides)


def cmd_train(args) -> int:
    from coderloo.controller import train

    summary = train(_config(args), resume=args.resume)
    print(json.dumps(summary, indent=2))
    return 0


def cmd_eval(args) -> int:
    import ray

    from coderloo.controller import resolve
    from coderloo.evaluation import evaluate
    from coderloo.runtime import init_ray
    from coderloo.tasksets.loading import load_tasks
    from reward_service.client import RewardClient
    from rollout_workers import RolloutGroup, RolloutWorker

    config = _config(args)
    _, tasks = load_tasks(config.tasks)
    init_ray(address=config.ray_address)
    rewards_service = RewardClient(config.reward)
    model = str(resolve(args.model or config.model.path))
    workers = [RolloutWorker.remote(model, config.rollout.backend, threads=config.rollout.threads)]
    try:
        result = evaluate(
            RolloutGroup(workers), rewards_service, tasks, n=config.eval.samples_per_task, ks=config.eval.k,
            temperature=config.eval.temperature, max_new_tokens=config.rollout.max_new_tokens,
            stop=config.rollout.stop, greedy=config.eval.greedy,
        )
    finally:
        ray.kill(workers[0])
        rewards_service.close()
    print(json.dumps({"model": model, "tasks": len(tasks), **result}, indent=2))
    return 0


def cmd_tasks(args) -> int:
    from coderloo.tasksets.synthetic import synthetic_suite
    from coderloo.tasksets.task import save_jsonl

    for split, tasks in synthetic_suite().items():
        save_jsonl(tasks, f"{args.out}/synthetic-{split}.jsonl")
        print(f"{args.out}/synthetic-{split}.jsonl: {len(tasks)} tasks")
    return 0


def main(argv: list[str] | None = None) -> int:
    apply_env_defaults()
    parser = argparse.ArgumentParser(prog="coderloo", description="RLOO post-training of code LLMs on Ray.")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, fn, help_text in (
        ("train", cmd_train, "SFT warm-up, then RLOO, with held-out evaluation"),
        ("eval", cmd_eval, "pass@k of a model on the evaluation set"),
    ):
        p = sub.add_parser(name, help=help_text)
        p.add_argument("--config", default=None, help="YAML config (default: the embedded defaults)")
        p.add_argument("overrides", nargs="*", help="section.field=value overrides, e.g. learner.lr=1e-5")
        p.set_defaults(fn=fn)
        if name == "eval":
            p.add_argument("--model", default=None, help="model directory (default: model.path)")
        if name == "train":
            p.add_argument(
                "--resume", action="store_true",
                help="continue from the latest checkpoint in train.output_dir (same config: weights, "
                "optimizer, data order and sampling continue exactly)",
            )
    p = sub.add_parser("tasks", help="write the synthetic suite as JSONL files")
    p.add_argument("--out", required=True)
    p.set_defaults(fn=cmd_tasks)
    args = parser.parse_args(argv)
    try:
        return args.fn(args)
    except (ConfigError, FileNotFoundError) as e:
        print(f"coderloo: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
