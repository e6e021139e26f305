"""A line for a long wait with no steps to count (a model build, an op compile, an image build):
it says what is being done and for how long, ticking each second, and stays with the time it
took. A wait with steps to count gets a tqdm bar where it happens."""
from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from tqdm import tqdm

TICK_S = 1.0


@contextmanager
def working(what: str) -> Iterator[None]:
    bar = tqdm(desc=what, total=None, bar_format="{desc}: {elapsed}", dynamic_ncols=True)
    done = threading.Event()

    def tick() -> None:
        while not done.wait(TICK_S):
            bar.refresh()

    ticker = threading.Thread(target=tick, name="progress", daemon=True)
    ticker.start()
    try:
        yield
    finally:
        done.set()
        ticker.join()
        bar.close()
