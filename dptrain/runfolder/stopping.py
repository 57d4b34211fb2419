"""A graceful stop: SIGTERM, SIGINT (Ctrl-C) and SIGUSR1 end a training run at the next step
boundary with a checkpoint, instead of killing it.

SLURM preemption and container stops send SIGTERM; a user presses Ctrl-C; SLURM's ``--signal``
can send SIGUSR1 ahead of a time limit. While the DP-SGD loop runs, :class:`StopSignals` turns
each of these into a request: the current step finishes (its noise drawn, its privacy cost
recorded), a checkpoint of that step is written to ``private/checkpoint.pt``, and the run ends
with :class:`RunStopped`. The command line prints where it stopped and the command that resumes
it, and exits with status :data:`EXIT_STOPPED` (75, "temporary failure": run it again to go on).
Nothing publishable is written for an unfinished run (no model.pt, no privacy.json), so the
folder holds no report that could describe a model it does not contain; ``trainer.resume=auto``
continues from the checkpoint and reaches the same epsilon as an uninterrupted run.

A second signal of the same kind while the step finishes is ignored; outside the loop (reading
data, accounting, writing) the signals keep their usual effect. Handlers are installed only in
the main thread and restored when the loop ends.
"""

from __future__ import annotations

import signal
import threading
from pathlib import Path

from dptrain.core.errors import DPTrainError

#: the exit status of a run stopped by a signal with a checkpoint to resume from (EX_TEMPFAIL)
EXIT_STOPPED = 75
SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)


class RunStopped(DPTrainError):
    """The run was asked to stop (a signal) and stopped at a step boundary."""

    def __init__(self, *, signal_name: str, step: int, planned: int, checkpoint: Path | None) -> None:
        self.signal_name, self.step, self.planned, self.checkpoint = signal_name, step, planned, checkpoint
        where = (f"checkpoint written at step {step}: {checkpoint}" if checkpoint is not None
                 else "no checkpoint (this run has no run folder to resume from)")
        super().__init__(f"stopped by {signal_name} after step {step} of {planned}; {where}; nothing publishable "
                         "was written")


class StopSignals:
    """Context manager: while active, the signals in :data:`SIGNALS` set :attr:`requested` (the
    first signal's name) instead of ending the process."""

    def __init__(self, *, enabled: bool = True) -> None:
        self.requested: str | None = None
        self.enabled = enabled  # off for a job across processes: its ranks must stop at one step
        self._previous: dict[int, object] = {}

    def _handle(self, signum: int, frame: object) -> None:
        if self.requested is None:
            self.requested = signal.Signals(signum).name

    def __enter__(self) -> StopSignals:
        if self.enabled and threading.current_thread() is threading.main_thread():
            for sig in SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()


def resume_hint(argv: list[str], run_dir: Path) -> str:
    """The command that continues a stopped run: the same command line, in the same folder, with
    ``trainer.resume=auto``."""
    kept = [a for a in argv if not a.startswith(("trainer.resume=", "hydra.run.dir="))]
    return " ".join(["python -m dptrain", *kept, "trainer.resume=auto", f"hydra.run.dir={run_dir}"])
