"""The CPU time the engine's model spends, for the step log: was a slow step the engine
computing (a compilation, page faults, a bigger batch than predicted) or the engine waiting
for a core (other work on its cores, or the VM's host)? A step's wall time alone cannot
tell; its CPU time beside it can.

vLLM runs the model in worker processes that are children of the EngineCore process, in
which the scheduler (and this reader) lives; with an in-process executor it runs in the
EngineCore itself. `EngineCPU` sums user and system CPU time over the children (found once,
at the first read) or, where there are none, over this process.
"""
from __future__ import annotations

import psutil


class EngineCPU:
    def __init__(self) -> None:
        self._procs: list[psutil.Process] | None = None

    def _processes(self) -> list[psutil.Process]:
        if self._procs is None:
            me = psutil.Process()
            self._procs = me.children(recursive=True) or [me]
        return self._procs

    def read(self) -> tuple[float, float]:
        """(user, system) CPU seconds so far, summed over the model's processes; a process
        that has exited counts no more."""
        user = system = 0.0
        for p in self._processes():
            try:
                t = p.cpu_times()
            except psutil.Error:
                continue
            user, system = user + t.user, system + t.system
        return user, system
