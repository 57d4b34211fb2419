"""Crash-safe training checkpoints: resuming restores the accountant's full history, and a
checkpoint written under other privacy settings is refused.

A checkpoint (``<run>/private/checkpoint.pt``, a PRIVATE file) holds what the rest of the run
depends on: model and optimizer state, the step reached, the accountant's full history, the time
spent and torch's global generator. The states of the SECRET streams (the Poisson sampler and
the noise generator) are stored only when the run opted into reproducible noise
(``privacy.noise_seed_file``): by default they never leave the process, because whoever holds
them can regenerate the noise of every step. A default run resumed from a checkpoint therefore
draws fresh streams from the OS CSPRNG: each later step's batch and noise are still independent
and distributed exactly as the accountant assumes, so the resumed run ends with the same
epsilon as an uninterrupted one (not the same parameters). With a seed file, the streams are
restored and the resumed run also ends with the same parameters.

It also holds the *privacy fingerprint* of the run (sigma, C, q, B, N, delta, planned steps,
accountant, and the dp/ curve's sigma_c, L and schedule): a resumed run whose settings differ
in any of these is refused, naming the field, because the accountant's history would no longer
describe the mechanism that produced the parameters.

The publishable model file (``<run>/model.pt``, :func:`save_model` / :func:`load_model`) is
separate: the final weights, the model's config, the objective and the PUBLIC feature encoder,
everything needed to score new rows (:mod:`dptrain.tasks.predict`, docs/api.md).

Writes are atomic: the checkpoint is written to a temporary file in the same folder, flushed
and fsynced, then renamed over the previous one, so a crash (even SIGKILL) leaves either the
old or the new checkpoint, never a truncated one. Loading uses ``torch.load(weights_only=True)``:
no arbitrary objects are unpickled from a checkpoint file.
"""

from __future__ import annotations

import glob
import math
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf

from dptrain.core.errors import DPTrainError
from dptrain.data import Schema, schema_from_config
from dptrain.runfolder.tracking import MODEL_FILENAME, model_path_in  # noqa: F401 - offered here as before

FORMAT = "dptrain-checkpoint-v2"
FILENAME = "checkpoint.pt"
SUBDIR = "private"  # checkpoints are private files (dptrain.runfolder.tracking.PRIVATE_DIR)

#: the settings that define the mechanism the accountant describes; a resume must match them
PRIVACY_FIELDS = (
    "enabled", "noise_multiplier", "max_grad_norm", "sample_rate", "expected_batch_size",
    "dataset_size", "delta", "planned_steps", "accountant", "world_size", "randomness",
    "curve_noise_multiplier", "curve_loss_bound", "curve_log_every",  # the dp/ curve (None: no curve)
)


def checkpoint_path_in(run_dir: Path) -> Path:
    """Where a run folder keeps its checkpoint: ``<run_dir>/private/checkpoint.pt``."""
    return Path(run_dir) / SUBDIR / FILENAME


class CheckpointError(DPTrainError):
    """A checkpoint cannot be used to resume this run; the message says why."""


def atomic_torch_save(obj: Any, path: Path) -> None:
    """``torch.save`` to a temporary file in the same folder, fsync, rename over ``path``.

    A writer killed mid-write (SIGKILL, power loss) leaves its temporary file behind; ``path``
    itself is then still the previous complete checkpoint. Such leftovers (``.NAME.*.tmp`` next
    to ``path``) are removed before the next write: a path has one writer at a time."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    for stale in path.parent.glob(f".{glob.escape(path.name)}.*.tmp"):
        stale.unlink(missing_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            torch.save(obj, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        _fsync_dir(path.parent)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _fsync_dir(folder: Path) -> None:
    """Make the rename itself durable (best effort: not every file system allows it)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def resolve_resume(resume: str | None, run_dir: Path) -> Path | None:
    """``trainer.resume``: None (start fresh), ``auto`` (this run folder's checkpoint if there is
    one, else start fresh) or a PATH (a checkpoint file, or a run folder holding one; it must
    exist)."""
    if resume is None:
        return None
    if resume == "auto":
        path = checkpoint_path_in(run_dir)
        return path if path.is_file() else None
    path = Path(resume).expanduser()
    if path.is_dir():
        path = checkpoint_path_in(path) if checkpoint_path_in(path).is_file() else path / FILENAME
    if not path.is_file():
        raise CheckpointError(
            f"trainer.resume={resume!r} is not allowed: no checkpoint file at {path} "
            "(give auto, a checkpoint file, or a run folder holding private/checkpoint.pt)"
        )
    return path


@dataclass(frozen=True)
class Checkpoint:
    """What a checkpoint holds. ``sampler_state`` / ``samplers`` (every rank's, in a distributed
    job) / ``noise_state`` are the secret streams' states: None unless the run opted into
    reproducible noise."""

    step: int
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    accountant_state: dict
    fingerprint: dict[str, Any]
    train_seconds: float
    sampler_state: dict | None = None
    samplers: list | None = None
    noise_state: torch.Tensor | None = None
    #: the device type ("cpu", "cuda") whose generators the stored stream states belong to
    streams_device: str | None = None
    #: trainer.average: the running mean of the averaged iterates so far and how many
    average: list[torch.Tensor] | None = None
    averaged: int = 0


def save_checkpoint(path: Path, checkpoint: Checkpoint) -> None:
    """Write ``checkpoint`` to ``path`` atomically (:func:`atomic_torch_save`)."""
    c = checkpoint
    atomic_torch_save({
        "format": FORMAT,
        "step": int(c.step),
        "model": c.model.state_dict(),
        "optimizer": c.optimizer.state_dict(),
        "accountant": c.accountant_state,
        "rng": {"sampler": c.sampler_state, "samplers": c.samplers, "noise": c.noise_state,
                "torch_global": torch.get_rng_state(), "streams_device": c.streams_device},
        "fingerprint": dict(c.fingerprint),
        "train_seconds": float(c.train_seconds),
        "average": None if c.average is None else [t.detach().cpu().clone() for t in c.average],
        "averaged": int(c.averaged),
    }, path)


def load_checkpoint(path: Path) -> dict[str, Any]:
    """Read a checkpoint (tensors and plain Python values only)."""
    try:
        state = torch.load(Path(path), map_location="cpu", weights_only=True)
    except Exception as err:  # corrupt, truncated, or not a torch file
        raise CheckpointError(f"checkpoint {path} cannot be read ({type(err).__name__}): {err}") from None
    if isinstance(state, dict) and state.get("format") == "dptrain-checkpoint-v1":
        raise CheckpointError(f"checkpoint {path} was written by an older dptrain (dptrain-checkpoint-v1), whose "
                              "runs derived their noise from the published seed; refusing to resume it. Start a "
                              "new run folder")
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CheckpointError(f"checkpoint {path} is not a {FORMAT} file")
    return state


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-12, abs_tol=0.0)
    return a == b


def check_fingerprint(saved: dict[str, Any], current: dict[str, Any], path: Path) -> None:
    """Refuse to resume under other privacy settings, naming every differing field."""
    diffs = [
        f"{name}: checkpoint {saved.get(name)!r}, this run {current.get(name)!r}"
        for name in PRIVACY_FIELDS if not _same(saved.get(name), current.get(name))
    ]
    if diffs:
        raise CheckpointError(
            f"checkpoint {path} was written under other privacy settings, so its accountant history "
            "would not describe this run; refusing to resume. Differences: " + "; ".join(diffs)
            + ". Start a new run folder (or trainer.resume=null) to train from scratch"
            + (" (the dp/ curve's fields follow trainer.dp_curves, trainer.log_every, trainer.curve_loss_bound and "
               "trainer.curve_budget_share)." if any(d.startswith("curve_") for d in diffs) else ".")
        )


def restore(
    state: dict[str, Any], *, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
    sampler: Any, noise_gen: torch.Generator, path: Path, rank: int = 0,
) -> None:
    """Load model, optimizer and torch's global generator from ``state`` (in place), and the
    secret streams' states where the checkpoint holds them (reproducible-noise runs only;
    otherwise the fresh streams the caller built are kept).

    Model and optimizer states load onto the device the model is on now, whatever device wrote
    them (a run checkpointed on a GPU resumes on a CPU and back). Stored stream states belong to
    one kind of generator (numpy and MT19937 on the CPU, Philox on a GPU): restoring them on
    another device type is refused, since the streams would not continue."""
    rng = state["rng"]
    stored = rng.get("streams_device") or "cpu"  # older checkpoints: CPU streams
    here = torch.device(noise_gen.device).type
    if (rng.get("noise") is not None or rng.get("sampler") is not None or rng.get("samplers")) and stored != here:
        raise CheckpointError(
            f"checkpoint {path} holds the secret streams of a run on {stored} (reproducible noise, "
            f"privacy.noise_seed_file) and this run computes on {here}: those streams cannot continue on another "
            f"kind of device; allowed: resume with trainer.device={stored}, or start a new run folder")
    try:
        model.load_state_dict(state["model"])
    except RuntimeError as err:
        first = str(err).splitlines()[0]
        raise CheckpointError(
            f"checkpoint {path} holds a different model architecture than model=... of this run ({first})"
        ) from None
    optimizer.load_state_dict(state["optimizer"])
    per_rank = rng.get("samplers")
    sampler_state = per_rank[rank] if per_rank else rng.get("sampler")
    if sampler_state is not None:
        sampler.set_state(sampler_state)
    if state["rng"].get("noise") is not None:
        noise_gen.set_state(state["rng"]["noise"])
    torch.set_rng_state(state["rng"]["torch_global"])


MODEL_FORMAT = "dptrain-model-v2"
#: builders a model file may name without ``trust_model_target`` (building a model runs its code)
TRUSTED_MODEL_PREFIX = "dptrain.models.networks."
#: the builders' names before the networks moved to dptrain.models.networks (older model files)
RENAMED_TARGETS = {"dptrain.models.logit": "dptrain.models.networks.logit",
                   "dptrain.models.mlp": "dptrain.models.networks.mlp"}


def schema_to_dict(schema: Schema) -> dict[str, Any]:
    """The public feature encoder as plain values (what model.pt stores): no row enters it."""
    out = {
        "target": schema.target,
        "positive": schema.positive,
        "numeric": [{"name": s.name, "lower": float(s.lower), "upper": float(s.upper), "transform": s.transform}
                    for s in schema.numeric],
        "categorical": [{"name": col, "labels": list(labels)} for col, labels in schema.categorical],
        "feature_names": list(schema.feature_names),
    }
    # a multiclass target's declared classes (output k = class k), a continuous target's bounds
    # (binary models' files are as before)
    if schema.classes is not None:
        out["classes"] = list(schema.classes)
    if schema.target_bounds is not None:
        out["target_bounds"] = {"lower": float(schema.target_bounds[0]), "upper": float(schema.target_bounds[1])}
    if schema.negative is not None:
        out["negative"] = schema.negative
    if schema.label_map:  # data.label_map: a file's labels -> the declared ones, applied to new rows too
        out["label_map"] = {col: dict(pairs) for col, pairs in schema.label_map}
    if schema.text_columns is not None:  # how the numbers are written (data.thousands / data.decimal)
        out["number_format"] = {"thousands": schema.thousands, "decimal": schema.decimal}
    return out


def schema_from_dict(stored: dict[str, Any], path: Path) -> Schema:
    """The :class:`dptrain.data.schema.Schema` a model file stores, checked again by the data
    module's own parser; its feature names must be the ones the model was trained on."""
    try:
        schema = schema_from_config({
            "target": stored["target"], "positive": stored["positive"],
            "numeric": {s["name"]: {"lower": s["lower"], "upper": s["upper"], "transform": s["transform"]}
                        for s in stored["numeric"]},
            "categorical": {c["name"]: list(c["labels"]) for c in stored["categorical"]},
            "classes": stored.get("classes"), "target_bounds": stored.get("target_bounds"),
            "negative": stored.get("negative"), "label_map": stored.get("label_map"),
            **(stored.get("number_format") or {}),
        }, require_negative=False)  # a file written before data.negative: its features encode alike
    except (KeyError, TypeError, DPTrainError) as err:
        raise CheckpointError(f"model file {path} holds no usable feature encoder ({err})") from None
    if list(schema.feature_names) != list(stored["feature_names"]):
        raise CheckpointError(f"model file {path} is inconsistent: its schema does not give its feature names")
    return schema


def save_model(path: Path, *, model: torch.nn.Module, model_config: dict, feature_names: list[str],
               schema: Schema, objective: str, report: dict[str, Any]) -> None:
    """The publishable model file (``model.pt``): final weights, the model's config (to rebuild
    it), the objective's name and the PUBLIC feature encoder of ``schema`` (the run's checked
    public schema): target, positive label, numeric bounds and transforms, category lists,
    feature names. Nothing in it is computed from private rows except the weights, which the
    run's guarantee covers (its ``guarantee``, epsilon and delta are stored beside them).
    Loadable with ``torch.load(path, weights_only=True)`` and :func:`load_model`."""
    resolved = schema
    if tuple(feature_names) != tuple(resolved.feature_names):
        raise CheckpointError(f"cannot write {path}: the model's features are not those of its public schema")
    atomic_torch_save({
        "format": MODEL_FORMAT,
        "state_dict": {k: v.detach().clone() for k, v in model.state_dict().items()},
        "model": model_config,
        "in_features": len(resolved.feature_names),
        "objective": str(objective),
        "schema": schema_to_dict(resolved),
        "feature_names": list(resolved.feature_names),
        "guarantee": report["guarantee"],
        "privacy": {k: report.get(k) for k in ("private", "epsilon", "delta", "accountant")},
        "coefficients": _coefficients_of(report),
    }, path)


def _coefficients_of(report: dict[str, Any]) -> dict[str, Any] | None:
    """The run's coefficient table as the report holds it (columns as lists, the summary text and
    the claim), for ``load_model(run).coefficients()``; None for a model without one."""
    est = report.get("estimator") or {}
    if not est.get("coefficients_table"):
        return None
    return {"table": est["coefficients_table"], "text": est.get("table", ""),
            "validity_check": est.get("validity_check"), "intervals": est.get("intervals")}


def _read_model_file(path: Path) -> dict[str, Any]:
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise CheckpointError(f"no model file at {path}; allowed: a training run folder holding model.pt, "
                              "or the path of a model.pt") from None
    except Exception as err:  # corrupt, truncated, or not a torch file
        raise CheckpointError(f"model file {path} cannot be read ({type(err).__name__}): {err}") from None
    fmt = state.get("format") if isinstance(state, dict) else None
    if fmt == "dptrain-model-v1":
        raise CheckpointError(f"model file {path} was written by an older dptrain ({fmt}), without its feature "
                              "encoder; retrain the model with this version to score new rows")
    if fmt != MODEL_FORMAT:
        raise CheckpointError(f"{path} is not a {MODEL_FORMAT} model file")
    return state


def _build_module(state: dict[str, Any], path: Path, *, objective: Any, spec: Any,
                  trust_model_target: bool) -> torch.nn.Module:
    """Rebuild the model from its config and load the weights (strictly)."""
    config = dict(state["model"])
    target = RENAMED_TARGETS.get(str(config.get("_target_", "")), str(config.get("_target_", "")))
    config["_target_"] = target
    if not target.startswith(TRUSTED_MODEL_PREFIX) and not trust_model_target:
        raise CheckpointError(
            f"model file {path} names model._target_={target!r}, not a dptrain.models.networks builder: building it "
            "runs that code. Allowed: load_model(..., trust_model_target=True) (task=predict: trust_model_target=true) "
            "for a file you trust, with the module importable (plugins=[...])")
    width = objective.output_width(spec)
    extra = {} if width == 1 else {"out_features": width}
    try:
        module = instantiate(OmegaConf.create(config), in_features=int(state["in_features"]), **extra)
        module.load_state_dict(state["state_dict"])
    except Exception as err:  # noqa: BLE001 - any failure to rebuild is a bad file
        cause = err.__cause__ or err
        raise CheckpointError(f"model file {path}: the model cannot be rebuilt from model._target_={target!r} "
                              f"({type(cause).__name__}: {str(cause).splitlines()[0] if str(cause) else ''})") from None
    return module.eval()


