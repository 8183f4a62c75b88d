"""While a ULFM job that ``hpcrep run --elastic --max-np`` started runs shrunk, probe the hosts it
no longer runs on and report those that answer again, for the job to grow back onto them
(:mod:`hpcrep.comm.hosts_back` describes the exchange; :mod:`hpcrep.launch.relaunch` does the
relaunch it ends with).
"""

from __future__ import annotations

import sys
import threading
from typing import Callable, Optional, Sequence

from hpcrep.comm import hosts_back
from hpcrep.launch.hosts import Host
from hpcrep.launch.relaunch import probe_hosts

INTERVAL = 5.0        # seconds between two rounds of probes
PROBE_TIMEOUT = 10.0  # seconds a probe may take (a cut host's ssh never answers)


class HealWatch:
    """A thread that, every :data:`INTERVAL` seconds while the job has said it runs on fewer
    hosts than ``hosts`` (:func:`hosts_back.running`), probes the others with ``probe_argv``
    (the launcher running ``true`` there) and writes those that answer
    (:func:`hosts_back.report_back`). Use as a context manager around one launch."""

    def __init__(self, directory: str, hosts: Sequence[Host],
                 probe_argv: Callable[[Host], list[str]], env: dict,
                 interval: float = INTERVAL, timeout: float = PROBE_TIMEOUT,
                 log: Callable[[str], None] = lambda line: print(line, file=sys.stderr,
                                                                 flush=True)) -> None:
        self.directory, self.hosts, self.probe_argv, self.env = directory, tuple(hosts), \
            probe_argv, env
        self.interval, self.timeout, self.log = interval, timeout, log
        self.reported: tuple[str, ...] = ()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def check_once(self) -> tuple[str, ...]:
        """Probe the hosts without ranks once; report and return those that answer."""
        running = hosts_back.running(self.directory)
        if running is None:
            return ()
        live = {hosts_back.short(h) for h in running}
        missing = [h for h in self.hosts if hosts_back.short(h.name) not in live]
        if not missing:
            return ()
        back = tuple(h.name for h in probe_hosts(missing, self.probe_argv, self.env,
                                                 self.timeout))
        if back and back != self.reported and not self._stop.is_set():
            hosts_back.report_back(self.directory, back)
            self.reported = back
            self.log(f"hpcrep run: elastic: {', '.join(back)} answer(s) again; the job grows "
                     "back onto them at its next commit (a relaunch from that commit)")
        return back

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.check_once()

    def __enter__(self) -> "HealWatch":
        self._thread = threading.Thread(target=self._loop, name="hpcrep-heal-watch", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.timeout + 5)
