"""The quiet console: an actor's lines go to logs/actors.log and only its errors reach the
terminal (with where the rest is); the libraries' log records go to logs/driver.log; --verbose
keeps them on the terminal too; Ray's own printer is back once the console closes."""
import logging
import sys
import time

import pytest
import ray

from coderloo.console import RunConsole


@ray.remote
class Chatty:
    def say(self, text: str, err: bool = False) -> None:
        print(text, file=sys.stderr if err else sys.stdout, flush=True)


def wait_for(path, text: str, timeout: float = 60) -> str:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if path.exists() and text in path.read_text():
            return path.read_text()
        time.sleep(0.2)
    raise AssertionError(f"{text!r} never reached {path}: {path.read_text() if path.exists() else '(no file)'}")


@pytest.mark.parametrize("verbose", [False, True])
def test_actor_lines_go_to_the_log_and_errors_to_the_terminal(ray_cluster, tmp_path, capfd, verbose):
    from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatcher

    ray_printers = list(dispatcher.handlers)
    actor = Chatty.remote()
    with RunConsole(verbose) as console:
        logging.getLogger("ray.serve").warning("a library's warning before the directory is known")
        console.log_to(tmp_path / "logs")
        console.attach_ray()
        ray.get(actor.say.remote(f"routine progress {verbose}"))
        ray.get(actor.say.remote(f"ValueError: something broke {verbose}", err=True))
        actors_log = wait_for(tmp_path / "logs" / "actors.log", f"something broke {verbose}")
        logging.getLogger("vllm").error("an engine error")
        time.sleep(1)  # what Ray's printer would have shown has had time to
    ray.kill(actor)
    assert dispatcher.handlers == ray_printers
    assert "(Chatty pid=" in actors_log and f"routine progress {verbose}" in actors_log
    driver_log = (tmp_path / "logs" / "driver.log").read_text()
    assert "a library's warning before the directory is known" in driver_log and "an engine error" in driver_log
    shown = capfd.readouterr()
    terminal = shown.out + shown.err
    assert f"something broke {verbose}" in terminal
    if verbose:  # Ray's printer and the libraries' own handlers show everything
        assert f"routine progress {verbose}" in terminal
    else:
        assert "an engine error" in terminal
        assert f"routine progress {verbose}" not in terminal and "a library's warning" not in terminal
        assert f"the full log: {tmp_path / 'logs' / 'actors.log'}" in terminal
        assert f"the full log: {tmp_path / 'logs' / 'driver.log'}" in terminal
