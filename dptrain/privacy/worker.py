"""The accounting worker: a run's accounting computed on the machine's second core while the run
imports torch, reads its data and trains.

A short DP-SGD run spends a third of its wall time on accounting that depends only on PUBLIC
values (the privacy settings, N, delta, the dp/ curve's settings): importing dp-accounting
(scipy.signal, scipy.stats, scipy.optimize: 1-1.6 s on a 2-core machine), calibrating the dp/
curve's noise (or sigma) with about ten RDP evaluations, and the report's PLD composition of the
whole run (0.3-0.9 s). None of it needs torch or a row of data, so it can run beside them
(docs/performance.md).

How it works:

1. :func:`start` forks a process before the run imports torch (``dptrain.cli.run``). The worker
   imports dp-accounting and waits. It never sees data: it gets the mechanism's public inputs.
2. When the run knows N (``dptrain.train.mechanism_for``), :func:`submit` sends them. The worker
   builds the same mechanism the run is about to build (the same code: the calibration's RDP
   evaluations, the curve's), sends every RDP vector and PLD epsilon it computed, then composes
   the planned run's whole history by every reported accountant and sends those too.
3. The run's accounting code is unchanged. Only its two leaf computations,
   ``_rdp_per_step(event)`` (an event's RDP curve) and the PLD epsilon of a history at delta,
   first ask :func:`lookup`. A value is used only for the identical key (the same event; the
   same ordered history and delta), and it is what the run would have computed: the same
   function on the same inputs in a copy of the same process. Any other key, a worker that
   failed or died, or one that did not answer within ``WAIT_SECONDS``, and the run computes the
   value itself, as it does without a worker.

The worker runs only where it can help and cannot change a result: task=train with
``estimator=dpsgd``, privacy on, one process (no torchrun), no resume, Linux (fork), and a core to
spare (:func:`spare_core`) unless ``DPTRAIN_ACCOUNTING_WORKER=1``, and only while the process
has no other thread (a fork copies one thread; a lock another held would stay held in the
worker); never with ``DPTRAIN_ACCOUNTING_WORKER=0``. It writes nothing, logs nothing
and prints nothing (its output goes to /dev/null); it ends after its last answer, when the run
closes its end, or with the run.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from typing import Any

log = logging.getLogger(__name__)

#: 0: compute the accounting in the run's own process; 1: use a worker whenever the run allows one,
#: whatever the machine's load; unset: when the machine has a core to spare (:func:`spare_core`)
ENV = "DPTRAIN_ACCOUNTING_WORKER"
#: how long the run waits for an answer before it computes the value itself
#: (``DPTRAIN_ACCOUNTING_WORKER_WAIT`` seconds when set)
WAIT_SECONDS = float(os.environ.get("DPTRAIN_ACCOUNTING_WORKER_WAIT", "60"))

_worker: _Worker | None = None
#: the worker's record of what it computed: {("rdp", event): vector, ("pld", history, delta): epsilon}
_recording: dict[tuple, Any] | None = None


class _Worker:
    """The run's end of the worker: its process, the pipe, and the answers received."""

    def __init__(self, process: Any, conn: Any) -> None:
        self.process, self.conn = process, conn
        self.answers: dict[tuple, Any] = {}
        self.submitted = False
        self.finished = False  # the worker said it is done, failed, died or timed out

    def receive(self, deadline: float) -> bool:
        """Read one message; False when none can come any more."""
        while not self.finished:
            try:
                if self.conn.poll(0.05):
                    kind, payload = self.conn.recv()
                    if kind == "answers":
                        self.answers.update(payload)
                        return True
                    self.finished = True  # "done", or "error": the run computes the rest itself
                    if kind == "error":
                        log.debug("accounting worker: %s", payload)
                    return False
            except (EOFError, OSError):
                self.finished = True
                return False
            if not self.process.is_alive() or time.monotonic() > deadline:
                self.finished = True
        return False

    def close(self) -> None:
        self.finished = True
        try:
            self.conn.close()
        except OSError:
            pass
        if self.process.is_alive():
            self.process.terminate()
        self.process.join(timeout=5)


def spare_core() -> bool:
    """Whether the machine has a core the worker can use: two or more usable cores, and the
    one-minute load average at least half a core below their number. On a machine whose cores are
    all busy the worker only moves work between processes and adds its own imports (measured on
    2 cores beside a CPU-bound process: 7.4 s -> 8.0 s; docs/performance.md)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        load = 0.0
    return cores >= 2 and cores - load >= 0.5


def eligible(cfg: Any) -> bool:
    """Whether a worker runs for this composed config (a DictConfig or mapping)."""
    from omegaconf import OmegaConf

    def get(key: str, default: Any = None) -> Any:
        return OmegaConf.select(cfg, key, default=default)

    import threading

    choice = os.environ.get(ENV, "").strip()
    if choice == "0" or not sys.platform.startswith("linux"):
        return False
    if threading.active_count() > 1:  # a fork copies only this thread: a lock another one holds would stay held
        return False
    return ((choice == "1" or spare_core()) and get("task") == "train"
            and get("estimator.name", "dpsgd") == "dpsgd" and get("privacy.enabled") is True
            and not get("trainer.distributed", False) and get("trainer.resume") is None
            and "RANK" not in os.environ)


def start(cfg: Any) -> None:
    """Fork the worker for the run about to start (nothing when not :func:`eligible`). Call it
    before the run imports torch: the fork copies only the command line's modules."""
    global _worker
    stop()
    if not eligible(cfg):
        return
    import multiprocessing

    context = multiprocessing.get_context("fork")
    ours, theirs = context.Pipe(duplex=True)
    process = context.Process(target=_serve, args=(theirs, ours), name="dptrain-accounting", daemon=True)
    try:
        process.start()
    except (AssertionError, OSError) as err:  # e.g. inside a daemonic process, which may have no children
        log.debug("accounting worker not started: %s", err)
        ours.close()
        theirs.close()
        return
    theirs.close()
    _worker = _Worker(process, ours)


def submit(**inputs: Any) -> None:
    """Send the mechanism's public inputs (``DPSGDMechanism.from_settings``'s arguments) to the
    worker, once; nothing when there is no worker."""
    if _worker is None or _worker.submitted or _worker.finished:
        return
    try:
        _worker.conn.send(inputs)
        _worker.submitted = True
    except (OSError, ValueError, TypeError) as err:  # a closed pipe, or inputs that do not pickle
        log.debug("accounting worker: %s", err)
        _worker.close()


def lookup(key: tuple) -> Any:
    """The worker's value for ``key``, or None (then the caller computes it). Waits for the
    worker's next answers while it may still send the key."""
    if _recording is not None or _worker is None or not _worker.submitted:
        return None
    deadline = time.monotonic() + WAIT_SECONDS
    while key not in _worker.answers and _worker.receive(deadline):
        pass
    return _worker.answers.get(key)


def record(key: tuple, value: Any) -> None:
    """In the worker: note a computed value for the run."""
    if _recording is not None:
        _recording[key] = value


def value_of(key: tuple, compute: Any) -> Any:
    """The value for ``key``: the worker's (:func:`lookup`) or else ``compute()``, which the
    worker itself records for the run (:func:`record`)."""
    found = lookup(key)
    if found is None:
        found = compute()
        record(key, found)
    return found


def stop() -> None:
    """Close the worker of the previous run, if any (a sweep runs jobs in one process)."""
    global _worker
    if _worker is not None:
        _worker.close()
        _worker = None


def _quiet() -> None:
    """The worker's output goes nowhere: not the run's log, not its console."""
    logging.disable(logging.CRITICAL)
    devnull = os.open(os.devnull, os.O_WRONLY)
    for fd in (1, 2):
        os.dup2(devnull, fd)
    os.close(devnull)
    sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - lives as long as the process
    sys.stderr = sys.stdout


def _serve(conn: Any, run_end: Any) -> None:
    """The worker process: import dp-accounting, wait for the mechanism's inputs, answer."""
    global _recording
    run_end.close()
    _quiet()
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    try:
        import dp_accounting  # noqa: F401 - the import is the first thing the worker saves the run

        from dptrain.privacy.accounting import REPORTED, PrivacyAccountant
        from dptrain.privacy.mechanism import DPSGDMechanism

        try:
            inputs = conn.recv()
        except (EOFError, OSError):
            return  # the run ended or computes everything itself
        _recording = {}
        mechanism = DPSGDMechanism.from_settings(**inputs)
        conn.send(("answers", dict(_recording)))
        if mechanism.private:
            planned = PrivacyAccountant()
            for event, count in mechanism.history_between(0, mechanism.planned_steps):
                planned.record(event, count)
            for name in dict.fromkeys([*REPORTED, mechanism.accountant]):
                planned.get_epsilon(delta=mechanism.delta, accountant=name)
            conn.send(("answers", dict(_recording)))
        conn.send(("done", None))
    except (EOFError, OSError):
        return
    except BaseException as err:  # noqa: BLE001 - any failure: the run computes the values itself
        try:
            conn.send(("error", f"{type(err).__name__}: {err}"))
        except (OSError, ValueError):
            pass
