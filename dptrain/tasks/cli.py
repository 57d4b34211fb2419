"""Hydra entry point: ``python -m dptrain experiment=NAME [key=value ...]``.

It only dispatches: the composed config's ``task`` names a :class:`~dptrain.tasks.registry.Task`
in ``TASKS`` whose ``run(cfg, run_dir=...)`` does the work (:mod:`dptrain.tasks.train`,
:mod:`dptrain.tasks.audit`, :mod:`dptrain.tasks.release`, ...). The modules of a ``plugins=[...]``
override on the command line are imported BEFORE Hydra composes the config
(:func:`preload_plugins`), so that what they register is known to the composition (a task's
schema, ``schema/NAME``, which its ``conf/task/NAME.yaml`` extends) and to every check after it
(objectives, accountants, engines, release methods, tasks); ``plugins`` set in a config file are
imported when the job starts, before the task runs (they cannot add a task). Every error a
user can cause is a :class:`dptrain.core.errors.DPTrainError`: it is printed once (on stderr)
with the setting, the value and what is allowed, and the run exits with status 2 before anything
is written; a run folder the refused launch created is removed. When the task returns, every file and
folder of its run folder gets one time, the run's start (a multirun: the sweep's), so that no
duration can be read from the folder (:func:`run`, docs/privacy.md).

Before Hydra writes anything into the run folder, :class:`LaunchChecks` (a Hydra callback,
``hydra.callbacks`` in conf/config.yaml) refuses keys the task's schema does not have (however
they were added: ``+key``, ``++key``), settings that would silently do nothing or the wrong
thing (judged with the command line: a sweep preset without ``-m``, an optimiser changed while
the learning rate stays the preset's, privacy settings without privacy) and a launch into a
folder that holds a finished run or any other run's files outside private/ (unless
``overwrite=true``, which empties it first, or ``trainer.resume`` of the same settings:
:mod:`dptrain.runfolder.ownership`). ``dptrain verify RUN`` and ``dptrain publish RUN DEST`` run
without Hydra (:mod:`dptrain.runfolder.verify`, :mod:`dptrain.runfolder.publish`).

Importing this module imports every task (and so torch and pandas): there is one import graph,
with no module imported inside a function (docs/architecture.md). ``python -m dptrain`` checks the
command line's keys and types with the light schemas first (:mod:`dptrain.settings.launch`) and
imports this module after (:mod:`dptrain.__main__`): a typo is refused before torch loads.
``python -m dptrain`` ends with :func:`exit_now`, which skips the interpreter's teardown.
"""

from __future__ import annotations

import atexit
import ctypes
import importlib.resources
import importlib.util
import logging
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, NoReturn

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import CompactHydraException, HydraException, InstantiationException, OverrideParseException
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from dptrain.core.errors import DPTrainError
from dptrain.core.registry import load_plugins
from dptrain.core.validation import ConfigError
from dptrain.runfolder import ownership, publish, runlock, verify
from dptrain.runfolder.folder import RunFolder, take_lock
from dptrain.runfolder.stopping import EXIT_STOPPED, RunStopped, resume_hint
from dptrain.runfolder.write_errors import folder_error, reason, write_error
from dptrain.settings import launch
from dptrain.settings.command_line import check_command_line, override_syntax_message
from dptrain.settings.launch import command_line_plugins, override_value
from dptrain.tasks import check as table_check
from dptrain.tasks.registry import TASKS, check_known_keys, register_configs, task_schemas
from dptrain.training.distributed import env_rank

log = logging.getLogger("dptrain")

register_configs()



def _fail(err: Exception) -> None:
    """Print the error once (stderr) and exit 2; the run's private log keeps it too when the run
    folder existed before (its console handler skips records marked ``console=False``:
    conf/hydra/job_logging/dptrain.yaml); a folder this launch created is removed with the refusal."""
    log.error("%s", err, extra={"console": False})
    print(f"dptrain: error: {err}", file=sys.stderr)
    raise SystemExit(2)


#: files that mark a folder as holding a finished run
FINISHED_RUN_FILES = ("privacy.json", "release.json", "audit.json", "predictions.csv", "private/predictions.csv")


def _finished_run(folder: Path, depth: int) -> Path | None:
    """The first file of FINISHED_RUN_FILES in ``folder`` (or, up to ``depth`` levels below it)."""
    for name in FINISHED_RUN_FILES:
        if (folder / name).is_file():
            return folder / name
    if depth > 0 and folder.is_dir():
        for sub in sorted(p for p in folder.iterdir() if p.is_dir()):
            found = _finished_run(sub, depth - 1)
            if found is not None:
                return found
    return None


def check_run_folder(config: DictConfig, *, multirun: bool) -> None:
    """Refuse to launch into a folder that holds a finished run (its report, checkpoint and
    .hydra/ would be overwritten, TensorBoard event files piled up) unless ``overwrite=true``,
    or ``trainer.resume`` continues it; and into a folder whose publishable area holds files this
    launch would not write (a killed run's leftovers, planted files: :func:`ownership.check_claim`).
    Runs before Hydra writes anything."""
    resume = OmegaConf.select(config, "trainer.resume", default=None)
    overwrite = config.get("overwrite", False) is True
    key = "hydra.sweep.dir" if multirun else "hydra.run.dir"
    folder = Path(str(OmegaConf.select(config, key)))
    found = None if overwrite or resume is not None else _finished_run(folder, 2 if multirun else 0)
    if found is not None:
        raise ConfigError(
            f"{key}={str(folder)!r} already holds a finished run ({found.relative_to(folder)}): launching into it "
            "would overwrite its report, checkpoint and .hydra/ settings; refused, nothing was written. Allowed: a "
            f"new folder (leave {key} out, or name another), trainer.resume=auto to continue a training run, or "
            "overwrite=true to replace it")
    for run in _run_folders(folder, multirun=multirun):
        differences = [] if multirun or resume is None else _config_differences(run, config)
        ownership.check_claim(run, key=key, overwrite=overwrite, resume=resume is not None, differences=differences)


def _run_folders(folder: Path, *, multirun: bool) -> list[Path]:
    """The run folder of a launch, or the job folders (up to two levels) of a sweep folder."""
    if not multirun:
        return [folder]
    below = [p for p in sorted(folder.glob("*")) + sorted(folder.glob("*/*")) if p.is_dir() and p.name != "private"]
    return [p for p in below if ownership.is_run_folder(p)]


def _config_differences(folder: Path, config: DictConfig) -> list[str] | None:
    """The settings in which ``config`` differs from the run recorded in ``folder``'s
    .hydra/config.yaml (None: no record), but for trainer.resume and overwrite."""
    record = folder / ".hydra" / "config.yaml"
    if not record.is_file():
        return None
    try:
        old = OmegaConf.to_container(OmegaConf.load(record), resolve=False)
    except (OSError, OmegaConfBaseException, ValueError):
        return None
    new = OmegaConf.to_container(config, resolve=False)
    new.pop("hydra", None)
    return ownership.config_differences(old, new)


def precheck(config: DictConfig, *, multirun: bool) -> None:
    """The checks that run after composition and before anything else (:class:`LaunchChecks`):
    unknown keys, settings judged with the command line, the run folder. ``config`` is the whole
    composed config, its ``hydra`` node included (overrides and config-group choices)."""
    check_known_keys(config)
    hydra_node = config.get("hydra")
    if hydra_node is not None:
        choices = dict(OmegaConf.select(config, "hydra.runtime.choices", default={}) or {})
        overrides = list(OmegaConf.select(config, "hydra.overrides.task", default=[]) or [])
        check_command_line(config, overrides=overrides, choices=choices, multirun=multirun)
        check_run_folder(config, multirun=multirun)


class LaunchChecks(Callback):
    """Hydra callback (conf/config.yaml, ``hydra.callbacks``): :func:`precheck` before a run or
    a sweep starts, i.e. before Hydra writes .hydra/ or the log into the run folder."""

    def on_run_start(self, config: DictConfig, **kwargs) -> None:
        self._check(config, multirun=False)

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        self._check(config, multirun=True)

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        """Release the sweep folder's lock, then give the folder and multirun.yaml the sweep's
        start again (removing the lock moved the folder's time)."""
        folder = OmegaConf.select(config, "hydra.sweep.dir", default=None)
        if folder is None:
            return
        sweep = Path(str(folder))
        started = sweep_started(sweep)
        runlock.release_all()
        if started is not None:
            for path in (sweep, sweep / SWEEP_FILE):
                os.utime(path, ns=(started, started))

    @staticmethod
    def _check(config: DictConfig, *, multirun: bool) -> None:
        try:
            precheck(config, multirun=multirun)
            folder = OmegaConf.select(config, "hydra.sweep.dir" if multirun else "hydra.run.dir", default=None)
            if folder is not None and _rank() == 0:  # one writer: taken before Hydra writes .hydra/
                lock = take_lock(Path(str(folder)))
                if config.get("overwrite", False) is True:
                    _clear_old_runs(Path(str(folder)), multirun=multirun)
                if not multirun:
                    lock.mark_start()
        except DPTrainError as err:
            print(f"dptrain: error: {err}", file=sys.stderr)
            raise SystemExit(2) from None
        except OSError as err:  # the folder cannot be made or locked: read-only, a file in the way, full
            key = "hydra.sweep.dir" if multirun else "hydra.run.dir"
            folder = OmegaConf.select(config, key, default=None)
            print(f"dptrain: error: {folder_error(err, key=key, folder=Path(str(folder)))}", file=sys.stderr)
            raise SystemExit(2) from None


def run(cfg: DictConfig, *, run_dir: Path, started_ns: int | None = None) -> float:
    """Run one job of the config's task; returns its objective (what a sweeper optimises).

    The job opens its run folder (:class:`dptrain.runfolder.folder.RunFolder`, which the task
    writes through) and so holds the folder's exclusive lock (:mod:`dptrain.runfolder.runlock`; the
    command line took it before Hydra wrote anything) for as long as it writes: a second process
    into the same folder is refused. A training run stopped by SIGTERM, SIGINT or SIGUSR1 ends at a
    step boundary with a checkpoint and exit status 75 (:mod:`dptrain.runfolder.stopping`). When the
    task has ended, the folder is closed: every file and folder of ``run_dir`` (.hydra/ and private/
    included) gets ONE modification and access time, ``started_ns`` (nanoseconds since the epoch;
    default: when this call began), so that no duration can be read from the folder: a search's
    duration grows with its secret number of candidates (docs/privacy.md, "Time")."""
    started_ns = time.time_ns() if started_ns is None else started_ns
    folder = None
    try:
        check_known_keys(cfg)  # again here for callers that compose without the command line
        if _rank() == 0:  # ranks > 0 of a torchrun job write no run folder
            folder = RunFolder.open(run_dir, started_ns=started_ns)
        load_plugins(list(cfg.get("plugins") or []))
        return TASKS.get(cfg.task).run(cfg, run_dir=run_dir)
    except RunStopped as stop:
        _stopped(stop, run_dir)
    except DPTrainError as err:
        if folder is not None:  # refused: leave no folder behind
            folder.discard()
        _fail(err)
    except OSError as err:  # a write refused (full disk, read-only): what was written stays
        _fail(write_error(err, folder=run_dir))
    finally:
        if folder is not None:
            _close(folder)


def _close(folder: RunFolder) -> None:
    """Close the run folder (the lock released, then every file stamped with the run's start); a
    folder that cannot be stamped any more (read-only, gone) keeps the times it has."""
    try:
        folder.close()
    except OSError as err:
        log.warning("the run folder's times could not be set: %s", reason(err), extra={"console": False})


def _clear_old_runs(folder: Path, *, multirun: bool) -> None:
    """``overwrite=true``: every file of the old run(s) in ``folder`` (a sweep's job folders below
    it) is removed before Hydra writes the new run's .hydra/ and log: what its report vouched for,
    what it did not, its private files (:func:`ownership.empty_run_folder`); the lock stays."""
    for run in _run_folders(folder, multirun=multirun):
        if ownership.is_run_folder(run):
            removed = ownership.empty_run_folder(run, whole=True)
            log.info("overwrite=true: emptied %s (%d entries removed)", run, len(removed), extra={"console": False})


def _stopped(stop: RunStopped, run_dir: Path) -> NoReturn:
    """A run stopped by a signal: where, the checkpoint, the command that resumes it; exit 75."""
    log.warning("%s", stop, extra={"console": False})
    lines = [f"dptrain: {stop}"]
    if stop.checkpoint is not None:
        lines.append(f"dptrain: resume with: {resume_hint(sys.argv[1:], run_dir)}")
    print("\n".join(lines), file=sys.stderr)
    raise SystemExit(EXIT_STOPPED)


#: the file Hydra writes at the top of a multirun folder when the sweep starts
SWEEP_FILE = "multirun.yaml"


def sweep_started(sweep_dir: Path) -> int | None:
    """When the sweep in ``sweep_dir`` started (the time Hydra wrote its multirun.yaml, in ns),
    or None. Every job of a sweep is stamped with it, not with its own start: the jobs run one
    after another, so each job's start would publish the durations of the jobs before it."""
    try:
        return (Path(sweep_dir) / SWEEP_FILE).stat().st_mtime_ns
    except OSError:
        return None


@hydra.main(version_base="1.3", config_path="pkg://dptrain.conf", config_name="config")
def _hydra_main(cfg: DictConfig) -> float:
    hydra_cfg = HydraConfig.get()
    sweep = Path(hydra_cfg.sweep.dir) if hydra_cfg.mode == RunMode.MULTIRUN else None
    started = sweep_started(sweep) if sweep is not None else None
    value = run(cfg, run_dir=Path(hydra_cfg.runtime.output_dir), started_ns=started)
    if started is not None:  # the sweep folder's own time moves when a job creates its folder
        for path in (sweep, sweep / SWEEP_FILE):
            os.utime(path, ns=(started, started))
    return value


#: hydra/launcher=NAME -> (the module its plugin installs, the extra of dptrain that installs it)
LAUNCHER_EXTRAS = {"slurm": ("hydra_plugins.hydra_submitit_launcher", "slurm"),
                   "submitit_slurm": ("hydra_plugins.hydra_submitit_launcher", "slurm"),
                   "submitit_local": ("hydra_plugins.hydra_submitit_launcher", "slurm")}


def check_launcher(argv: list[str]) -> None:
    """``hydra/launcher=slurm`` needs the optional extra: say how to install it (Hydra alone
    only says it cannot find the config)."""
    for arg in argv:
        key, _, name = arg.partition("=")
        if key.lstrip("+") != "hydra/launcher" or name not in LAUNCHER_EXTRAS:
            continue
        module, extra = LAUNCHER_EXTRAS[name]
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            print(f"dptrain: error: hydra/launcher={name} is not allowed here: its Hydra plugin is not installed; "
                  f"allowed: install it with pip install -e \".[{extra}]\" (in the dptrain checkout) or pip install "
                  f"\"dptrain[{extra}]\", or use hydra/launcher=joblib_1thread (this machine)", file=sys.stderr)
            raise SystemExit(2)


def _rank() -> int:
    """This process' rank under torchrun (:func:`dptrain.training.distributed.env_rank`); 0 without a RANK
    in the environment."""
    return env_rank() if "RANK" in os.environ else 0


def preload_plugins(argv: list[str]) -> None:
    """Import the command line's ``plugins`` before Hydra composes the config, then register the
    config schemas again (:func:`dptrain.tasks.registry.register_configs`): a plugin task's
    ``conf/task/NAME.yaml`` extends ``schema/NAME``, and :class:`LaunchChecks` checks the composed
    keys against the task's schema. A module that cannot be imported is refused by name (exit 2)."""
    modules = command_line_plugins(argv)
    if not modules:
        return
    try:
        load_plugins(modules)
    except DPTrainError as err:
        print(f"dptrain: error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    register_configs()


#: the longest name of one folder on the file systems a run folder lives on (ext4, xfs, btrfs)
MAX_FOLDER_NAME = 255
#: options of Hydra's that take the next argument as their value
_VALUE_OPTIONS = ("--config-dir", "-cd", "--config-path", "-cp", "--config-name", "-cn")
#: Hydra's other options that take the next argument as their value (--cfg job, --info defaults)
_HYDRA_VALUE_OPTIONS = ("--cfg", "-c", "--package", "-p", "--info", "-i", "--experimental-rerun")


def check_sweep_folders(argv: list[str]) -> None:
    """A sweep (``-m``) names each run's folder after its overrides (conf/config.yaml:
    ``hydra.sweep.subdir``, keys in ``exclude_keys`` left out). Refuse, before anything runs, a
    sweep whose folder name would be longer than a file system allows (a schema written on the
    command line, ``++data.numeric={...}``, easily is): Hydra would stop at the first run with an
    OSError. No check when ``hydra.sweep.subdir`` is set on the command line."""
    if not any(a in ("-m", "--multirun") for a in argv):
        return
    texts, skip = [], False
    for a in argv:
        if skip or a.startswith("-"):
            skip = a in _VALUE_OPTIONS
            continue
        texts.append(a)
    try:
        parsed = OverridesParser.create().parse_overrides(texts)
    except (OverrideParseException, HydraException):
        return  # Hydra's own message follows
    if any(o.is_hydra_override() and o.key_or_group == "hydra.sweep.subdir" for o in parsed):
        return
    excluded = set(OmegaConf.select(_packaged_config(), "hydra.job.config.override_dirname.exclude_keys") or [])
    items = []
    for text, override in zip(texts, parsed):
        if override.is_hydra_override() or override.key_or_group in excluded:
            continue
        values = [override_value(v) for v in override.sweep_iterator()] if override.is_sweep_override() else None
        items.append(text if values is None else f"{text.split('=', 1)[0]}={max(values, key=len)}")
    longest = max((len(part.encode()) for part in ",".join(sorted(items)).split("/")), default=0)
    if longest > MAX_FOLDER_NAME:
        print(f"dptrain: error: -m: each run of this sweep would get a folder named after its overrides, "
              f"{longest} characters long (at most {MAX_FOLDER_NAME}); allowed: the long settings (a schema's "
              "data.numeric / data.categorical) in a data config file (--config-dir DIR data=NAME, "
              "docs/quickstart.md), or hydra.sweep.subdir=${hydra.job.num} (folders numbered 0, 1, ...)",
              file=sys.stderr)
        raise SystemExit(2)


def _packaged_config() -> DictConfig:
    """conf/config.yaml as shipped (the data package dptrain.conf), unresolved."""
    with importlib.resources.as_file(importlib.resources.files("dptrain.conf") / "config.yaml") as path:
        return OmegaConf.load(path)


def check_override_syntax(argv: list[str]) -> None:
    """An override Hydra's grammar cannot read (a label with letters outside ASCII, ``>50K``, an
    unclosed bracket) is refused in dptrain's words, with the quoted form that works and the
    config-file alternative (:func:`dptrain.settings.command_line.override_syntax_message`),
    instead of Hydra's lexer error and its grammar link."""
    parser = OverridesParser.create()
    skip = False
    for text in argv:
        if skip or text.startswith("-"):
            skip = text in (*_VALUE_OPTIONS, *_HYDRA_VALUE_OPTIONS)
            continue
        if "=" not in text:  # not an override (Hydra says what it is)
            continue
        try:
            parser.parse_overrides([text])
        except OverrideParseException as err:
            message = override_syntax_message(text, err, lambda t: parser.parse_overrides([t]))
            print(f"dptrain: error: {message}", file=sys.stderr)
            raise SystemExit(2) from None


def check_composition(argv: list[str]) -> None:
    """:func:`dptrain.settings.launch.check_composition` with every registered task's schema,
    plugins' included (a command line the light first step already checked is not composed again)."""
    launch.check_composition(argv, task_schemas())


#: what the bare ``python -m dptrain`` says first (README, "Presets and overrides")
NO_PRESET_NOTE = ("dptrain: no preset: task=train with every setting at its default (docs/settings.md: UCI Adult with "
                  "all its codings, sigma 1.0, 5 epochs, delta from N), not the README's first run "
                  "(python -m dptrain experiment=logit); python -m dptrain --help lists the presets")


def main() -> None:
    if sys.argv[1:2] == ["verify"]:  # dptrain verify RUN: check a run folder's digests (no Hydra)
        raise SystemExit(verify.main(sys.argv[2:]))
    if sys.argv[1:2] == ["publish"]:  # dptrain publish RUN DEST: export the vouched files (no Hydra)
        raise SystemExit(publish.main(sys.argv[2:]))
    if sys.argv[1:2] == ["check"]:  # dptrain check SETTINGS: the data holder's check of a table (no run)
        raise SystemExit(table_check.main(sys.argv[2:]))
    if not sys.argv[1:]:
        print(NO_PRESET_NOTE, file=sys.stderr)
    check_override_syntax(sys.argv[1:])
    check_launcher(sys.argv[1:])
    preload_plugins(sys.argv[1:])
    check_composition(sys.argv[1:])
    check_sweep_folders(sys.argv[1:])
    if _rank() > 0:
        # torchrun starts one process per rank; only rank 0 writes a run folder. The others get
        # no Hydra output folder and no log file (and so cannot race rank 0 for its files).
        sys.argv = [a for a in sys.argv if not a.startswith(("hydra.run.dir=", "hydra.output_subdir=",
                                                              "hydra/job_logging="))]
        sys.argv += ["hydra.output_subdir=null", "hydra/job_logging=stdout",
                     f"hydra.run.dir={Path(tempfile.gettempdir()) / 'dptrain-rank-unused'}"]
    _hydra_in_our_words()


def _hydra_in_our_words() -> None:
    """Run Hydra's main with its errors raised to here (HYDRA_FULL_ERROR=1 while it runs, unless
    the user set the variable): a write Hydra itself makes for the run (the folder, .hydra/, a
    sweep's multirun.yaml) refused by the system, or a composition error the checks before did not
    catch, ends in one ``dptrain: error:`` line and exit 2 instead of a traceback. A user who set
    HYDRA_FULL_ERROR=1 gets Hydra's own behaviour. The log never raises on a full disk
    (``logging.raiseExceptions``: a record that cannot be written is dropped, not a traceback)."""
    logging.raiseExceptions = False
    before = os.environ.get(FULL_ERROR_ENV)
    if before == "1":
        _hydra_main()
        return
    os.environ[FULL_ERROR_ENV] = "1"
    try:
        _hydra_main()
    except InstantiationException:
        raise
    except CompactHydraException as err:  # before OSError: Hydra's MissingConfigException is an IOError
        print(f"dptrain: error: {' '.join(str(err).split())}. Every setting, its type and allowed values: "
              "docs/settings.md (python -m dptrain --help)", file=sys.stderr)
        raise SystemExit(2) from None
    except OSError as err:  # a write Hydra makes for the run (.hydra/, multirun.yaml): the folder's lock
        runlock.release_all()  # taken before it is released here (what was written stays)
        print(f"dptrain: error: {write_error(err, folder=None)}", file=sys.stderr)
        raise SystemExit(2) from None
    finally:
        if before is None:
            os.environ.pop(FULL_ERROR_ENV, None)
        else:
            os.environ[FULL_ERROR_ENV] = before


#: Hydra's switch between its short error report (unset) and raising the error (1)
FULL_ERROR_ENV = "HYDRA_FULL_ERROR"


#: set to 1 to end ``python -m dptrain`` with the interpreter's full teardown instead of :func:`exit_now`
FULL_EXIT_ENV = "DPTRAIN_FULL_EXIT"


def fast_exit_allowed() -> bool:
    """Whether :func:`exit_now` may skip the interpreter's teardown: not when asked not to
    (``DPTRAIN_FULL_EXIT=1``), under a profiler or tracer (they write their data after the
    program ends), or while a thread the interpreter would wait for is still running."""
    if os.environ.get(FULL_EXIT_ENV, "").strip() not in ("", "0"):
        return False
    if sys.gettrace() is not None or sys.getprofile() is not None or not hasattr(atexit, "_run_exitfuncs"):
        return False
    main_thread = threading.main_thread()
    return not any(t.is_alive() and not t.daemon for t in threading.enumerate() if t is not main_thread)


def exit_now(code: Any = 0) -> NoReturn:
    """End the process with ``code`` (a SystemExit code) the way the interpreter would, minus its
    teardown: the threading module's and the atexit handlers run (the log's handlers are flushed
    and closed, multiprocessing cleaned up), Python's and C's output buffers are flushed, and then
    the process ends without freeing every object of torch, scipy, sklearn and pandas one by one
    (1.6-4.9 s of the logit runs measured on a loaded 2-core machine: docs/performance.md). Every
    file of a run is written, closed and renamed into place before this; an exit that may not be
    skipped (:func:`fast_exit_allowed`) raises SystemExit as usual."""
    if not fast_exit_allowed():
        raise SystemExit(code)
    if code is None:
        status = 0
    elif isinstance(code, int):
        status = code
    else:  # SystemExit("message"): the interpreter prints the message and exits 1
        print(code, file=sys.stderr)
        status = 1
    shutdown = getattr(threading, "_shutdown", None)  # what the interpreter runs first: the threading
    if shutdown is not None:  # module's own exit hooks (concurrent.futures'); no thread is left to join
        shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):  # a closed pipe or stream: as at a normal exit, nothing more to do
            pass
    try:
        ctypes.CDLL(None).fflush(None)  # C libraries' buffered output (what exit() would flush)
    except (OSError, AttributeError):
        pass
    os._exit(status & 0xFF)


def main_and_exit() -> NoReturn:
    """``python -m dptrain``: :func:`main`, then :func:`exit_now` with its exit status."""
    try:
        main()
    except SystemExit as exc:
        exit_now(exc.code)
    exit_now(0)


if __name__ == "__main__":
    main()
