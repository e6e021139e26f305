"""A run's terminal: its own lines (progress bars, evaluation lines, warnings a person must read)
and, by default, nothing else. What Ray, its actors (vLLM, DeepSpeed, Serve's replicas) and the
libraries in this process log goes to files in the run's `logs/` directory:

- `logs/actors.log`: every line the actors and Ray's daemons print, as Ray streams them to the
  driver from every node, each prefixed with the actor's name and pid (as Ray prints them);
- `logs/driver.log`: the Python logging of Ray, Serve, vLLM, DeepSpeed, transformers and the
  warnings of this process.

An actor's line that says an error happened still reaches the terminal, once per batch of lines,
with the file that holds the rest. `verbose` keeps everything on the terminal as well.

Ray streams the actors' output through one dispatcher in the driver, and the errors it reports
about the job (a task that failed, a worker that died, the memory monitor's kills) through its
printer: the console puts its own handler in both places for as long as it is open, and puts
Ray's back after. Ray's errors reach the terminal too, except once the run is `ending` (its
actors being killed on purpose).
"""
from __future__ import annotations

import logging
import re
import sys
from pathlib import Path

from tqdm import tqdm

# The loggers of the libraries a run drives (child loggers included: `ray.serve`, `vllm.engine`).
LIBRARY_LOGGERS = ("ray", "vllm", "deepspeed", "transformers", "torch", "py.warnings", "filelock", "urllib3", "httpx",
                   "mlflow", "alembic", "sqlalchemy", "wandb")
# A line an actor printed that a person must see: a traceback, an error-level log record, a fatal signal.
ERROR_LINE = re.compile(r"Traceback \(most recent call last\)|\b(ERROR|CRITICAL|FATAL)\b|^\w*(Error|Exception): |"
                        r"Fatal Python error|Segmentation fault|core dumped")
# Ray's marker of a line it added itself ("... [repeated 3x across cluster]" and the like).
RAY_INFO_PREFIX = ":info_message:"


def _terminal_handler(handler: logging.Handler) -> bool:
    return isinstance(handler, logging.StreamHandler) and getattr(handler, "stream", None) in (sys.stderr, sys.stdout,
                                                                                               sys.__stderr__, sys.__stdout__)


class RunConsole:
    """See the module's docstring. Use as a context manager; `log_to` names the directory of the
    files once it is known (lines before it are kept and written there then), `attach_ray` takes
    over the actors' output once Ray is up, and `quiet_loggers` takes over what libraries
    configured after the console opened (Ray and Serve set up their loggers when they start)."""

    def __init__(self, verbose: bool = False):
        self.verbose = verbose
        self.directory: Path | None = None
        self.pending: dict[str, list[str]] = {"actors.log": [], "driver.log": []}
        self.files: dict[str, object] = {}
        self.removed: list[tuple[logging.Logger, logging.Handler]] = []
        self.added: list[logging.Logger] = []
        self.ray_handlers: list | None = None
        self.ray_printer = None
        self.is_ending = False
        self.handler = _FileHandler(self)
        self.handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))

    # --- opening and closing ---

    def __enter__(self) -> "RunConsole":
        logging.captureWarnings(True)
        self.quiet_loggers()
        return self

    def __exit__(self, *exc) -> None:
        if self.ray_handlers is not None:
            from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatcher

            dispatcher.handlers = self.ray_handlers
            self.ray_handlers = None
            import ray._private.worker as ray_worker

            ray_worker.print_to_stdstream = self.ray_printer
        for logger, handler in self.removed:
            logger.addHandler(handler)
        for logger in self.added:
            logger.removeHandler(self.handler)
        logging.captureWarnings(False)
        for f in self.files.values():
            f.close()
        self.files.clear()

    def log_to(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        for name, lines in self.pending.items():
            self._write(name, "".join(lines))
        self.pending.clear()

    def quiet_loggers(self) -> None:
        """Route the libraries' loggers to driver.log (and, unless verbose, off the terminal)."""
        manager = logging.Logger.manager
        names = [n for n in list(manager.loggerDict) if n.split(".")[0] in LIBRARY_LOGGERS] + list(LIBRARY_LOGGERS)
        for name in dict.fromkeys(names):
            logger = logging.getLogger(name)
            terminal = [h for h in logger.handlers if _terminal_handler(h)]
            if not self.verbose:
                for handler in terminal:
                    logger.removeHandler(handler)
                    self.removed.append((logger, handler))
            # a logger of its own that did not pass its records up gets the file too
            if (name in LIBRARY_LOGGERS or terminal or not logger.propagate) and self.handler not in logger.handlers:
                logger.addHandler(self.handler)
                self.added.append(logger)

    def attach_ray(self) -> None:
        """Take the actors' output from Ray's printer (call once Ray is up in this process)."""
        from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatcher

        import ray._private.worker as ray_worker

        if self.ray_handlers is None:
            self.ray_handlers = dispatcher.handlers
            printers = self.ray_handlers if self.verbose else []
            dispatcher.handlers = [("coderloo_console", self._actor_lines), *printers]
            self.ray_printer = ray_worker.print_to_stdstream
            ray_worker.print_to_stdstream = self._ray_error
        self.quiet_loggers()

    def ending(self) -> None:
        """The run is tearing down its actors: Ray's reports of them dying go to the log only."""
        self.is_ending = True

    # --- lines ---

    def where(self, name: str) -> str:
        return str(self.directory / name) if self.directory else f"logs/{name}"

    def _write(self, name: str, text: str) -> None:
        if not text:
            return
        if self.directory is None:
            self.pending[name].append(text)
            return
        f = self.files.get(name)
        if f is None:
            f = self.files[name] = (self.directory / name).open("a", buffering=1)
        f.write(text)

    def _actor_lines(self, data: dict) -> None:
        """One batch of lines of one actor (or of Ray's raylet or autoscaler), as Ray streams them."""
        pid = data.get("pid")
        who = data.get("actor_name") or data.get("task_name") or "worker"
        prefix = f"({pid})" if pid in ("raylet", "autoscaler") else f"({who} pid={pid}" + (
            f", ip={data['ip']})" if data.get("ip") and data.get("ip") != data.get("localhost") else ")")
        lines = [line.split(RAY_INFO_PREFIX)[-1] for line in data.get("lines", [])]
        self._write("actors.log", "".join(f"{prefix} {line}\n" for line in lines))
        if self.verbose:
            return
        errors = [line for line in lines if ERROR_LINE.search(line)]
        if errors:
            rest = f" (+{len(lines) - 1} lines)" if len(lines) > 1 else ""
            tqdm.write(f"{prefix} {errors[0].strip()[:300]}{rest}; the full log: {self.where('actors.log')}", file=sys.stderr)


    def _ray_error(self, data: dict, ignore_prefix: bool) -> None:
        """An error Ray reports about this job (its only other use of its printer)."""
        self._write("actors.log", "".join(f"({data.get('pid', 'ray')}) {line}\n" for line in data.get("lines", [])))
        if self.verbose:
            self.ray_printer(data, ignore_prefix)
        elif not self.is_ending:
            for line in data.get("lines", []):
                tqdm.write(f"ray: {line.strip()[:500]}; the full log: {self.where('actors.log')}", file=sys.stderr)


class _FileHandler(logging.Handler):
    """Log records of this process into driver.log; an error record also on the terminal, once."""

    def __init__(self, console: RunConsole):
        super().__init__(logging.DEBUG)
        self.console = console
        self.last: logging.LogRecord | None = None

    def emit(self, record: logging.LogRecord) -> None:
        if record is self.last:  # a record on its way up through two loggers that both have this handler
            return
        self.last = record
        try:
            self.console._write("driver.log", self.format(record) + "\n")
            if record.levelno >= logging.ERROR and not self.console.verbose:
                tqdm.write(f"{record.name}: {record.getMessage()[:300]}; the full log: {self.console.where('driver.log')}",
                           file=sys.stderr)
        except Exception:  # a log line must never end the run
            self.handleError(record)
