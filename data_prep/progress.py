"""Progress bar with docs/s and words/s, fed from this process or from worker processes through a queue."""
from __future__ import annotations

import queue
import sys
import threading
import time
from typing import Any

from tqdm import tqdm


class _Tqdm(tqdm):
    # tqdm's default monitor thread (started by every instance, even a disabled one) would make a 1-worker
    # run import spaCy with torch visible (see spacy_light: hiding torch needs a single thread), +2 s.
    monitor_interval = 0


class ProgressBar:
    def __init__(self, desc: str, enabled: bool = True):
        self.t0: float | None = None     # clock starts with the first report (after model loading)
        self.words = 0
        self.bar = _Tqdm(desc=desc, unit=" docs", disable=not enabled, dynamic_ncols=True,
                         mininterval=0.5 if sys.stderr.isatty() else 30.0)

    def update(self, docs: int, words: int) -> None:
        now = time.time()
        if self.t0 is None:  # the first batch was done before the clock started: the rate counts what follows
            self.t0 = now
            self.bar.reset()
            self.bar.update(docs)
            return
        self.words += words
        self.bar.update(docs)
        if now - self.t0 >= 0.1:
            self.bar.set_postfix_str(f"{self.words / (now - self.t0):,.0f} words/s", refresh=False)

    def close(self) -> None:
        self.bar.close()


class QueueListener:
    """Drains (docs, words) messages that workers put on a queue into a ProgressBar."""

    def __init__(self, q: Any, bar: ProgressBar):
        self.q, self.bar = q, bar
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set() or not self.q.empty():
            try:
                docs, words = self.q.get(timeout=0.2)
            except queue.Empty:
                continue
            except (EOFError, OSError):
                return
            self.bar.update(docs, words)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
