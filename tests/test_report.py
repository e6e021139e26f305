"""The run report (coderloo/report.py): built from a run's JSONL alone, opened in headless Chromium,
whose DOM after the report's script ran must hold every chart with one mark per data point, and
whose screenshot must show them. A missing Chromium is a failure: the report is checked for real."""
from __future__ import annotations

import json
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from browser import run_chromium
from coderloo.cli import main
from coderloo.config import dump_config, load_config
from coderloo.report import _inline_json, write_report

HOSTILE = '</script><script>document.title = "pwned"</script><img src=x onerror="document.body.dataset.pwned = 1"> & <!--'
FAMILIES = ["synthetic/add_const", "synthetic/reverse_list", "synthetic/sum_digits"]


class DomCount(HTMLParser):
    """Counts, in a DOM dump, the marks of each chart (svg[data-chart] > .point/.line/.bar), the
    elements by tag, and collects the text of <pre> blocks and of the .not-recorded notes."""

    def __init__(self, dom: str):
        super().__init__()
        self.chart, self.marks, self.tags, self.pre, self.notes, self.body = None, {}, {}, [], [], {}
        self._text: list[str] | None = None
        self.feed(dom)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.tags[tag] = self.tags.get(tag, 0) + 1
        if tag == "body":
            self.body = attrs
        if tag == "svg" and "data-chart" in attrs:
            self.chart = attrs["data-chart"]
            self.marks[self.chart] = {}
        elif self.chart and attrs.get("class") in ("point", "line", "bar"):
            counts = self.marks[self.chart]
            counts[attrs["class"]] = counts.get(attrs["class"], 0) + 1
        if tag == "pre" or attrs.get("class") == "not-recorded":
            self._text = []

    def handle_endtag(self, tag):
        if tag == "svg":
            self.chart = None
        if self._text is not None and tag in ("pre", "div"):
            (self.pre if tag == "pre" else self.notes).append("".join(self._text))
            self._text = None

    def handle_data(self, data):
        if self._text is not None:
            self._text.append(data)


def write_run(run_dir: Path, rl_steps: int = 6, sft_steps: int = 5, with_breakdown: bool = True, ppo: bool = False,
              components: tuple[str, ...] = ()) -> None:
    """A run directory as coderloo.controller.run writes it, with made-up but realistic numbers:
    evaluations at the start, after SFT, every 2 RL steps and at the end. `with_breakdown=False`
    is a run from before the pass rates by difficulty and family and the samples' feedback."""
    run_dir.mkdir(parents=True)
    rng = np.random.default_rng(0)
    t = 1_790_000_000.0
    records, samples, evals = [], [], {}

    def evaluation(stage: str, step: int, skill: float) -> None:
        nonlocal t
        t += 20
        record = {"phase": "eval", "step": step, "time": t, "stage": stage, "version": step,
                  "pass@1": skill, "pass@4": min(1.0, 2 * skill), "greedy_pass@1": skill * 1.1}
        if with_breakdown:
            record["by_difficulty"] = {str(level): skill / level for level in (1, 2, 3)}
            record["by_family"] = {family: skill * (i + 1) / 3 for i, family in enumerate(FAMILIES)}
        records.append(record)
        evals["base" if stage == "base" else "after_sft" if step == 0 else "final"] = {
            k: v for k, v in record.items() if k not in ("phase", "step", "time", "stage", "version")}

    evaluation("base", 0, 0.0)
    for step in range(1, sft_steps + 1):
        t += 1
        records.append({"phase": "sft", "step": step, "time": t, "sft_loss": 6.0 / step, "grad_norm": 3.0})
    evaluation("rl", 0, 0.12)
    for step in range(1, rl_steps + 1):
        wait, learn, sync = rng.uniform(1.5, 2.5), rng.uniform(2.0, 3.0), rng.uniform(0.02, 0.05)
        t += wait + learn + sync
        records.append({
            "phase": "rl", "step": step, "time": t, "version": step + 1, "samples": 64, "reward_mean": 0.2 + 0.05 * step,
            "pass_rate": 0.1 + 0.04 * step, "syntax_rate": 0.9, "time_generate_s": wait * 0.7, "time_score_tail_s": wait * 0.2,
            "time_wait_rollouts_s": wait, "time_learn_s": learn, "time_sync_s": sync, "time_step_s": wait + learn + sync + 0.003,
            "learner_idle_fraction": wait / (wait + learn + sync), "loss": 0.01, "grad_norm": float("nan"),
        })
        if with_breakdown:  # an older run has neither, nor the wait split by what it waited for
            records[-1].update(entropy=5.0 - 0.3 * step, clip_fraction_low=0.01 * step, clip_fraction_high=0.02,
                               time_wait_generation_s=wait * 0.6, time_wait_scoring_s=wait * 0.4, time_wait_refill_s=0.0)
        if ppo:
            records[-1].update(explained_variance=-0.5 + 0.2 * step, value_loss=0.3 / step)
        records[-1].update({f"component_{name}_mean": 0.1 * step / (k + 1) for k, name in enumerate(components)})
        completions = [f"    return n + {step}\n", HOSTILE, "    return sorted(xs)\n", "    retur n\n"]
        sample = {"phase": "rl", "step": step, "time": t, "task": f"synthetic/add_const/{step}",
                  "completions": completions, "rewards": [1.1, 0.0, 0.1, 0.0]}
        if with_breakdown:
            sample["feedback"] = ["", "SyntaxError: invalid syntax <stdin>", "Failed: 1 of 5 tests did not pass", "SyntaxError"]
        samples.append(sample)
        if step % 2 == 0 and step != rl_steps:
            evaluation("rl", step, 0.12 + 0.02 * step)
    evaluation("rl", rl_steps, 0.3)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (run_dir / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in samples))
    if with_breakdown:  # an old run's directory has neither
        dump_config(load_config("configs/default.yaml", [f"train.steps={rl_steps}", f"sft.steps={sft_steps}"]), run_dir / "config.yaml")
        (run_dir / "summary.json").write_text(json.dumps({**evals, "policy_version": rl_steps + 1, "output_dir": str(run_dir)}))


def test_inline_json_cannot_end_its_script_block():
    data = {"completion": HOSTILE, "<key>": "a & b"}
    text = _inline_json(data)
    assert "<" not in text and ">" not in text and "&" not in text
    assert json.loads(text) == data


def test_report_renders_every_chart_in_chromium(tmp_path):
    run_dir = tmp_path / "run"
    write_run(run_dir, rl_steps=6, sft_steps=5)
    report = write_report(run_dir)
    dump = run_chromium(tmp_path, "--dump-dom", report.as_uri())
    dom = DomCount(dump)

    evaluations, metrics, columns = 5, 3, 3  # start, after SFT, steps 2 and 4, final; pass@1, pass@4, greedy; start / after SFT / final
    assert dom.marks == {
        "train": {"line": 2, "point": 2 * 6},
        "entropy": {"line": 1, "point": 6},
        "clipping": {"line": 2, "point": 2 * 6},
        "sft": {"line": 1, "point": 5},
        "eval": {"line": metrics, "point": metrics * evaluations},
        "timeline": {"bar": 6 * 6},  # wait: generation, scoring, refill; learn, weight sync, other
        "rollouts": {"bar": 6 * 2},  # generate, score tail
        "by_difficulty": {"bar": 3 * columns},
        "by_family": {"bar": len(FAMILIES) * columns},
    }
    # model output is shown as text: it did not end the data block, run, or add an element
    assert dom.tags["script"] == 2 and "img" not in dom.tags and "data-pwned" not in dom.body
    assert "<title>coderloo run run</title>" in dump
    assert dom.pre.count(HOSTILE) == 3  # the three latest steps' groups
    assert "SyntaxError: invalid syntax <stdin>" in dom.pre
    assert dom.notes == []


def test_a_ppo_run_with_plugged_in_reward_components_also_charts_its_value_model_and_them(tmp_path):
    run_dir = tmp_path / "run"
    write_run(run_dir, rl_steps=6, sft_steps=5, ppo=True, components=("dataflow", "robot"))
    dom = DomCount(run_chromium(tmp_path, "--dump-dom", write_report(run_dir).as_uri()))
    assert dom.marks["value"] == {"line": 2, "point": 2 * 6}  # explained variance and value loss, each step
    assert dom.marks["components"] == {"line": 2, "point": 2 * 6}  # each component's mean score, each step
    assert dom.notes == []


def test_report_screenshot_shows_the_charts(tmp_path):
    run_dir = tmp_path / "run"
    write_run(run_dir)
    report = write_report(run_dir)
    png = tmp_path / "report.png"
    run_chromium(tmp_path, f"--screenshot={png}", "--window-size=1280,2400", "--hide-scrollbars", report.as_uri())
    pixels = np.asarray(Image.open(png).convert("RGB")).astype(int)
    assert pixels.shape[:2] == (2400, 1280)
    ink = np.abs(pixels - np.array([0xFF, 0xFF, 0xFF])).sum(axis=2) > 100  # not the page, a card or a border
    assert ink.mean() > 0.05  # text and charts, not a blank page
    for color in (0x3B6FB6, 0xE07B39):  # the first two series' colours: lines, points and bars were drawn
        rgb = np.array([color >> 16, (color >> 8) & 0xFF, color & 0xFF])
        assert (np.abs(pixels - rgb).sum(axis=2) < 40).sum() > 2000, hex(color)


def test_a_run_from_before_the_breakdowns_still_has_a_report(tmp_path):
    run_dir = tmp_path / "old"
    write_run(run_dir, rl_steps=4, sft_steps=3, with_breakdown=False)
    dom = DomCount(run_chromium(tmp_path, "--dump-dom", write_report(run_dir).as_uri()))
    assert set(dom.marks) == {"train", "sft", "eval", "timeline", "rollouts"}
    assert dom.marks["timeline"] == {"bar": 4 * 4}  # its wait for rollouts whole, learn, weight sync, other
    assert dom.notes == ["Policy entropy: not recorded in this run's files", "Clipped tokens: not recorded in this run's files",
                         "Pass rate by difficulty: not recorded in this run's files",
                         "Pass rate by task family: not recorded in this run's files"]
    assert dom.tags["pre"] == 3 * 4  # the completions; each feedback cell says "not recorded"


def test_report_command_rebuilds_the_report_from_the_jsonl(tmp_path, capsys):
    run_dir = tmp_path / "run"
    write_run(run_dir)
    assert main(["report", str(run_dir)]) == 0
    assert (run_dir / "report.html").stat().st_size > 10_000 and (run_dir / "training.png").exists()
    assert str(run_dir / "report.html") in capsys.readouterr().out

    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["report", str(empty)]) == 2
    assert str(empty / "metrics.jsonl") in capsys.readouterr().err

    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    lines[2] = lines[2][:-5]
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    assert main(["report", str(run_dir)]) == 2
    assert f"{run_dir / 'metrics.jsonl'}:3: invalid JSON" in capsys.readouterr().err
