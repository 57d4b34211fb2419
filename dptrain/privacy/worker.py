"""The accounting worker: a run's accounting, and its scikit-learn work, computed on the machine's
second core while the run imports torch, reads its data and trains.

A short DP-SGD run spends a third of its wall time on accounting that depends only on PUBLIC
values (the privacy settings, N, delta, the dp/ curve's settings): importing dp-accounting
(scipy.signal, scipy.stats, scipy.optimize: 1-1.6 s on a 2-core machine), calibrating the dp/
curve's noise (or sigma) with about ten RDP evaluations, and the report's PLD composition of the
whole run (0.3-0.9 s). None of it needs torch or a row of data, so it can run beside them. The
evaluation's scikit-learn work (importing it: another 1-2 s, scipy.stats included; the NON-private
baseline's fit: 0.6-1 s; the test ROC AUC) needs the rows but not torch (docs/performance.md).

How it works:

1. :func:`start` forks a process before the run imports torch (``dptrain.cli.run``). The worker
   imports dp-accounting, then (in a thread, when the run will need it) scikit-learn, and waits.
2. When the run knows N (``dptrain.train.mechanism_for``), :func:`submit` sends the mechanism's
   public inputs. The worker builds the same mechanism the run is about to build (the same code:
   the calibration's RDP evaluations, the curve's), sends every RDP vector and PLD epsilon it
   computed, then composes the planned run's whole history by every reported accountant and
   sends those too.
3. The run's accounting code is unchanged. Only its two leaf computations,
   ``_rdp_per_step(event)`` (an event's RDP curve) and the PLD epsilon of a history at delta,
   first ask :func:`lookup`. A value is used only for the identical key (the same event; the
   same ordered history and delta), and it is what the run would have computed: the same
   function on the same inputs in a copy of the same process. Any other key, a worker that
   failed or died, or one that did not answer within ``WAIT_SECONDS``, and the run computes the
   value itself, as it does without a worker.
4. The scikit-learn work goes the same way (:mod:`dptrain.baselines`). The run sends the
   baseline's fit once it has set up training (:func:`send_job`: the training and test rows as
   numpy arrays) and each test ROC AUC when it evaluates; each job runs in a thread of its own.
   :func:`job_value` returns the worker's answer to an equal call (the same function; the
   arguments compared by a SHA-256 digest taken when they were sent), else the run computes it
   itself. So with a worker the run's process imports neither scikit-learn nor scipy.

What the worker sees: the accounting's inputs are public, and the mechanism and its epsilons are
computed from them alone (nothing a job carries enters them). The rows a job carries (at most
``MAX_JOB_BYTES``; larger ones stay in the run's process) are as private as the run's own copy:
the worker is a fork of the run's process, gets them over a pipe between the two (no file),
writes, logs and prints nothing (its output goes to /dev/null), and ends with the run or when the
run closes its end.

The worker runs only where it can help and cannot change a result: task=train with
``estimator=dpsgd``, privacy on, one process (no torchrun), no resume, Linux (fork), and a core to
spare (:func:`spare_core`) unless ``DPTRAIN_ACCOUNTING_WORKER=1``, and only while the process
has no other thread (a fork copies one thread; a lock another held would stay held in the
worker); never with ``DPTRAIN_ACCOUNTING_WORKER=0``.
"""

from __future__ import annotations

import hashlib
import logging
import os
import sys
import time
from typing import Any, NamedTuple

log = logging.getLogger(__name__)

#: 0: compute the accounting in the run's own process; 1: use a worker whenever the run allows one,
#: whatever the machine's load; unset: when the machine has a core to spare (:func:`spare_core`)
ENV = "DPTRAIN_ACCOUNTING_WORKER"
#: how long the run waits for an answer before it computes the value itself
#: (``DPTRAIN_ACCOUNTING_WORKER_WAIT`` seconds when set)
WAIT_SECONDS = float(os.environ.get("DPTRAIN_ACCOUNTING_WORKER_WAIT", "60"))
#: a job whose arrays are larger is computed by the run itself: the worker would hold a second copy
MAX_JOB_BYTES = 256 * 2**20

_worker: _Worker | None = None
#: the worker's record of what it computed: {("rdp", event): vector, ("pld", history, delta): epsilon}
_recording: dict[tuple, Any] | None = None


class Answer(NamedTuple):
    """A job's value as the worker computed it (a wrapper, so that None is a value too)."""

    value: Any


class _Worker:
    """The run's end of the worker: its process, the pipe, and the answers received."""

    def __init__(self, process: Any, conn: Any) -> None:
        self.process, self.conn = process, conn
        self.answers: dict[tuple, Any] = {}
        self.submitted = False
        self.accounting_done = False  # the worker sent all it computes for the mechanism, or failed
        self.finished = False  # the worker died, closed its end, or timed out: nothing more comes
        self.jobs: list[tuple[int, tuple]] = []  # (job id, the call's digest), in the order sent
        self.results: dict[int, tuple[bool, Any]] = {}  # job id -> (computed, value or error text)

    def receive(self, deadline: float | None) -> None:
        """Wait for one message and file it; on a closed pipe, a dead worker or past ``deadline``
        (None: none while the worker lives) mark the worker finished."""
        while not self.finished:
            try:
                if self.conn.poll(0.05):
                    kind, payload = self.conn.recv()
                    if kind == "answers":
                        self.answers.update(payload)
                    elif kind == "accounting-done":
                        self.accounting_done = True
                        if payload is not None:  # the run computes the rest itself
                            log.debug("accounting worker: %s", payload)
                    elif kind == "job":
                        job_id, computed, value = payload
                        self.results[job_id] = (computed, value)
                    return
            except (EOFError, OSError):
                self.finished = True
                return
            if not self.process.is_alive() or (deadline is not None and time.monotonic() > deadline):
                self.finished = True

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
    process = context.Process(target=_serve, args=(theirs, ours, _uses_sklearn(cfg)), name="dptrain-accounting",
                              daemon=True)
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
    while key not in _worker.answers and not _worker.accounting_done and not _worker.finished:
        _worker.receive(deadline)
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


def _uses_sklearn(cfg: Any) -> bool:
    """Whether the run will ask for a scikit-learn computation (a baseline fit, a ROC AUC): then the
    worker imports scikit-learn ahead of it."""
    from omegaconf import OmegaConf

    return bool(OmegaConf.select(cfg, "trainer.baseline", default=True)) or OmegaConf.select(
        cfg, "objective.name", default="binary") in ("binary", "multinomial")


def _digest(value: Any) -> Any:
    """What :func:`job_value` compares calls by: arrays by dtype, shape and a SHA-256 digest of
    their bytes (taken when the job is sent, so a later change to the rows is noticed), other
    values by type and repr."""
    import numpy as np

    if isinstance(value, np.ndarray):
        data = np.ascontiguousarray(value)
        return ("array", data.dtype.str, data.shape, hashlib.sha256(data.view(np.uint8).reshape(-1)).digest())
    if isinstance(value, (tuple, list)):
        return (type(value).__name__, tuple(_digest(v) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple((k, _digest(value[k])) for k in sorted(value)))
    return (type(value).__name__, repr(value))


def _size(value: Any) -> int:
    if isinstance(value, (tuple, list)):
        return sum(_size(v) for v in value)
    if isinstance(value, dict):
        return sum(_size(v) for v in value.values())
    return int(getattr(value, "nbytes", 0))


def send_job(name: str, args: tuple, kwargs: dict, *, digest: Any = None) -> int | None:
    """Send ``dptrain.baselines.FUNCTIONS[name](*args, **kwargs)`` to the worker; its id, or None
    when there is no worker to send it to, or its arrays exceed ``MAX_JOB_BYTES``. ``digest``:
    the call's :func:`_digest` when the caller has it already."""
    if _recording is not None or _worker is None or _worker.finished or _size((args, kwargs)) > MAX_JOB_BYTES:
        return None
    job_id = len(_worker.jobs)
    try:
        _worker.conn.send(("job", (job_id, name, args, kwargs)))
    except (OSError, ValueError, TypeError) as err:  # a closed pipe, or arguments that do not pickle
        log.debug("accounting worker: %s", err)
        _worker.close()
        return None
    _worker.jobs.append((job_id, digest if digest is not None else _digest((name, args, kwargs))))
    return job_id


def job_value(name: str, args: tuple, kwargs: dict) -> Answer | None:
    """The worker's answer to this call, or None (then the caller computes it): the answer to an
    equal call sent before (:func:`send_job`), else to this one, sent now. Waits while the worker
    lives; a job that failed in the worker is the caller's to compute."""
    if _recording is not None or _worker is None or _worker.finished:
        return None
    key = _digest((name, args, kwargs))
    job_id = next((i for i, d in _worker.jobs if d == key), None)
    if job_id is None:
        job_id = send_job(name, args, kwargs, digest=key)
        if job_id is None:
            return None
    while job_id not in _worker.results and not _worker.finished:
        _worker.receive(None)
    computed, value = _worker.results.get(job_id, (False, "no answer"))
    if not computed:
        log.debug("accounting worker: job %s: %s", name, value)
        return None
    return Answer(value)


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


def _inbox(conn: Any) -> Any:
    """A queue the worker's messages arrive in, read from the pipe by a thread as soon as they
    come: the run's send of a job's rows never waits for the worker to finish what it computes."""
    import queue
    import threading

    inbox: queue.Queue = queue.Queue()

    def read() -> None:
        while True:
            try:
                inbox.put(conn.recv())
            except (EOFError, OSError):
                inbox.put(None)  # the run closed its end or ended
                return
            except BaseException:  # noqa: BLE001 - e.g. a message that does not unpickle: stop reading
                inbox.put(None)
                return

    threading.Thread(target=read, name="dptrain-worker-inbox", daemon=True).start()
    return inbox


def _account(conn: Any, inputs: dict) -> None:
    """Build the mechanism from the run's public inputs and send every value computed for it."""
    global _recording
    from dptrain.privacy.accounting import REPORTED, PrivacyAccountant
    from dptrain.privacy.mechanism import DPSGDMechanism

    _recording = {}
    try:
        mechanism = DPSGDMechanism.from_settings(**inputs)
        conn.send(("answers", dict(_recording)))
        if mechanism.private:
            planned = PrivacyAccountant()
            for event, count in mechanism.history_between(0, mechanism.planned_steps):
                planned.record(event, count)
            for name in dict.fromkeys([*REPORTED, mechanism.accountant]):
                planned.get_epsilon(delta=mechanism.delta, accountant=name)
            conn.send(("answers", dict(_recording)))
    except (EOFError, OSError):
        raise
    except BaseException as err:  # noqa: BLE001 - any failure: the run computes the values itself
        conn.send(("accounting-done", f"{type(err).__name__}: {err}"))
        return
    conn.send(("accounting-done", None))


def _job(conn: Any, payload: tuple) -> None:
    """Run one of dptrain.baselines' functions and send its value, or why it failed."""
    job_id, name, args, kwargs = payload
    try:
        from dptrain.baselines import FUNCTIONS

        answer = (job_id, True, FUNCTIONS[name](*args, **kwargs))
    except BaseException as err:  # noqa: BLE001 - any failure: the run computes the value itself
        answer = (job_id, False, f"{type(err).__name__}: {err}")
    try:
        conn.send(("job", answer))
    except (OSError, ValueError):
        pass  # the run ended


def _warm_up() -> None:
    try:
        from dptrain.baselines import warm_up

        warm_up()
    except Exception:  # noqa: BLE001 - a job would then fail, and the run compute it itself
        pass


class _Sender:
    """The worker's end of the pipe for its threads: one message at a time."""

    def __init__(self, conn: Any) -> None:
        import threading

        self.conn, self.lock = conn, threading.Lock()

    def send(self, message: Any) -> None:
        with self.lock:
            self.conn.send(message)


def _serve(conn: Any, run_end: Any, sklearn: bool = False) -> None:
    """The worker process: import dp-accounting (then scikit-learn when the run will need it),
    then answer the run's messages in order: the mechanism's inputs, and jobs."""
    import threading

    run_end.close()
    _quiet()
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    # the worker's threads (the inbox, jobs, the accounting) pass the interpreter's lock every
    # 0.5 ms instead of 5 ms: a job's rows arrive in chunks, each waiting for the lock once
    sys.setswitchinterval(0.0005)
    inbox = _inbox(conn)
    conn = _Sender(conn)
    try:
        import dp_accounting  # noqa: F401 - the import is the first thing the worker saves the run

        import dptrain.privacy.mechanism  # noqa: F401

        if sklearn:  # beside the accounting, which must not wait for it; a job waits for the import
            threading.Thread(target=_warm_up, name="dptrain-worker-imports", daemon=True).start()
        while (message := inbox.get()) is not None:
            if isinstance(message, dict):
                _account(conn, message)
            else:  # each job in a thread of its own: a ROC AUC need not wait for a baseline's fit
                threading.Thread(target=_job, args=(conn, message[1]), name="dptrain-worker-job", daemon=True).start()
    except (EOFError, OSError):
        return
    except BaseException as err:  # noqa: BLE001 - any failure: the run computes the values itself
        try:
            conn.send(("accounting-done", f"{type(err).__name__}: {err}"))
        except (OSError, ValueError):
            pass
