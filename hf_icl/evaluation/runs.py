"""One file format for evaluation results, and reading a tree of runs into one table.

``hf-icl train`` (its final evaluation), ``hf-icl evaluate`` and the Garg suite
(:func:`~hf_icl.evaluation.garg_suite.run_garg_suite`) each write a ``metrics.json`` in their output
directory with :func:`write_metrics`; :func:`read_runs` walks a directory of such runs and returns one tidy
``pandas.DataFrame``.

The ``metrics.json`` schema (format ``hf_icl.metrics/1``)::

    {
      "format": "hf_icl.metrics/1",
      "model": "gpt2_icl",                      # the model's name (str or null)
      "task": "linear_regression",              # the family it was trained on (str or null)
      ...                                       # any further metadata (JSON values)
      "evaluations": {
        "standard": {                           # evaluation name: "standard", an OOD kind, a Garg suite name
          "metric": "squared_error/d",          # PositionMetric.name
          "n_prompts": 1280,                    # prompts behind every curve
          "seed": 0,                            # seed of the prompts and of the bootstrap
          "target_kind": "regression",          # optional: regression | binary | categorical
          "normalizer": 20.0,                   # optional: the squared-error normaliser's value
          "confidence": [0.05, 0.95],           # optional: the bootstrap quantiles of lower/upper
          ...                                   # optional scalars (e.g. "evaluated_task")
          "model_folder": "/abs/runs/tiny",     # optional (hf-icl evaluate): the model folder evaluated, resolved
          "model_identity": "3f5a...",          # optional (hf-icl evaluate): its model_identity() at the time
          "predictors": {
            "gpt2_icl": {"mean": [...], "lower": [...], "upper": [...]},   # one value per position:
            "least_squares": {...},                                        # index i = i in-context examples
            "trivial": {...}
          }
        }
      },
      "scalars": {"final_loss": 0.01, "steps": 500000}   # run-level numbers (may be empty)
    }

:func:`evaluation_entry` turns a :class:`~hf_icl.evaluation.ContextScalingResult` into one entry of
``"evaluations"`` and :func:`result_from_entry` turns it back (for plots and tables); :func:`write_curve_csv`
writes one entry's curves as CSV. :func:`read_runs` links an evaluation that records its ``model_folder`` to
the training run in that folder (column ``model_run``). Files are written atomically (a temporary file, then
``os.replace``), so a reader never sees half a file and an interrupted writer leaves the previous version.

Example::

    >>> import tempfile, pathlib, torch
    >>> from hf_icl.data.tasks import get_task
    >>> from hf_icl.evaluation import evaluate_context_scaling
    >>> from hf_icl.estimators import get_estimator
    >>> result = evaluate_context_scaling(
    ...     {"averaging": get_estimator("averaging")}, get_task("linear_regression", n_dims=2), n_prompts=8, n_points=3
    ... )
    >>> root = pathlib.Path(tempfile.mkdtemp())
    >>> path = write_metrics(root / "run_a" / "metrics.json", {"standard": evaluation_entry(result, seed=0)},
    ...                      model="none", task="linear_regression", scalars={"steps": 0})
    >>> table = read_runs(root)
    >>> table[["run", "evaluation", "predictor", "n_examples", "steps"]].iloc[0].to_dict()
    {'run': 'run_a', 'evaluation': 'standard', 'predictor': 'averaging', 'n_examples': 0, 'steps': 0}
"""

from __future__ import annotations

import csv
import functools
import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from ..files import write_atomically
from .context_scaling import ContextScalingResult
from .metrics import ACCURACY, SQUARED_ERROR, PositionMetric

#: The ``"format"`` value of every file this module writes and reads.
METRICS_FORMAT = "hf_icl.metrics/1"
#: The file name :func:`read_runs` looks for.
METRICS_FILE = "metrics.json"
#: The columns every :func:`read_runs` row has, first and in this order.
RUN_COLUMNS = ("run", "evaluation", "predictor", "n_examples", "value", "lower", "upper", "metric")
CURVE_FIELDS = ("mean", "lower", "upper")
#: The fields of an evaluation entry that say which model folder it evaluated (see :func:`evaluated_model`).
MODEL_FOLDER, MODEL_IDENTITY = "model_folder", "model_identity"
REQUIRED_ENTRY_FIELDS = {"metric": str, "n_prompts": int, "seed": int, "predictors": dict}


def evaluation_entry(result: ContextScalingResult, *, seed: int, **extra: Any) -> dict[str, Any]:
    """One ``"evaluations"`` entry from a result: its curves, metric, prompt count, ``seed`` and ``extra`` fields."""
    if not isinstance(result, ContextScalingResult):
        raise ValueError(f"result must be a ContextScalingResult, got {type(result).__name__}")
    metric = result.metric
    entry = {
        "metric": metric.name,
        "n_prompts": result.n_prompts,
        "seed": seed,
        "target_kind": metric.target_kind,
        "normalizer": metric.normalizer,
        "confidence": list(result.confidence),
        **({"n_classes": metric.n_classes} if metric.n_classes is not None else {}),
        **extra,
        "predictors": predictor_curves(result),
    }
    check_entry(entry, "result")
    return entry


def predictor_curves(result: ContextScalingResult) -> dict[str, dict[str, list[float]]]:
    """``{predictor: {"mean": [...], "lower": [...], "upper": [...]}}`` of a result, as plain lists."""
    bands = dict(zip(CURVE_FIELDS, (result.values, result.lower, result.upper), strict=True))
    return {name: {field: curves[name].tolist() for field, curves in bands.items()} for name in result.predictors}


def result_from_entry(entry: Mapping[str, Any], task_name: str = "") -> ContextScalingResult:
    """A :class:`~hf_icl.evaluation.ContextScalingResult` (curves, bands, metric) from a stored entry, to plot
    or tabulate it; entries without ``target_kind``/``normalizer`` are read from their metric name."""
    check_entry(entry, "entry")
    name = entry["metric"]
    if name.startswith(SQUARED_ERROR):
        symbol = name.partition("/")[2] or None
        metric = PositionMetric("regression", float(entry.get("normalizer", 1.0)), normalizer_symbol=symbol)
    else:
        metric = PositionMetric(entry.get("target_kind", "binary"), n_classes=entry.get("n_classes"))

    def curves(field: str) -> dict[str, torch.Tensor]:
        return {p: torch.tensor(c[field], dtype=torch.float64) for p, c in entry["predictors"].items()}

    return ContextScalingResult(
        metric=metric,
        values=curves("mean"),
        lower=curves("lower"),
        upper=curves("upper"),
        n_prompts=entry["n_prompts"],
        task_name=task_name,
        confidence=tuple(entry.get("confidence", (0.05, 0.95))),
    )


def check_entry(entry: Any, where: str) -> None:
    """Raise a ``ValueError`` naming ``where`` unless ``entry`` is a valid ``"evaluations"`` entry."""
    if not isinstance(entry, Mapping):
        raise ValueError(f"{where} must be a mapping (an evaluation entry), got {type(entry).__name__}")
    for field, kind in REQUIRED_ENTRY_FIELDS.items():
        value = entry.get(field)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise ValueError(f"{where} needs {field!r} of type {kind.__name__}, got {value!r}")
    if not entry["metric"].startswith(SQUARED_ERROR) and entry["metric"] != ACCURACY:
        raise ValueError(f"{where}: metric must be '{SQUARED_ERROR}/…' or '{ACCURACY}', got {entry['metric']!r}")
    for name, curve in entry["predictors"].items():
        if not isinstance(curve, Mapping) or any(not isinstance(curve.get(f), list) for f in CURVE_FIELDS):
            raise ValueError(f"{where}: predictor {name!r} needs lists 'mean', 'lower' and 'upper', got {curve!r}")
        lengths = {len(curve[f]) for f in CURVE_FIELDS}
        if len(lengths) != 1:
            raise ValueError(f"{where}: predictor {name!r} has curves of different lengths {sorted(lengths)}")


def metrics_document(
    evaluations: Mapping[str, Mapping[str, Any]],
    *,
    model: str | None = None,
    task: str | None = None,
    scalars: Mapping[str, Any] | None = None,
    **metadata: Any,
) -> dict[str, Any]:
    """The JSON document :func:`write_metrics` writes (validated)."""
    if not isinstance(evaluations, Mapping):
        raise ValueError(f"evaluations must be a mapping of names to entries, got {type(evaluations).__name__}")
    for name, entry in evaluations.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"evaluation names must be non-empty strings, got {name!r}")
        check_entry(entry, f"evaluation {name!r}")
    for field, value in (("model", model), ("task", task)):
        if value is not None and not isinstance(value, str):
            raise ValueError(f"{field} must be a string or None, got {value!r}")
    if scalars is not None and not isinstance(scalars, Mapping):
        raise ValueError(f"scalars must be a mapping of names to numbers, got {type(scalars).__name__}")
    reserved = {"format", "evaluations", "scalars"} & set(metadata)
    if reserved:
        raise ValueError(f"metadata must not use the reserved keys {sorted(reserved)}")
    return {
        "format": METRICS_FORMAT,
        "model": model,
        "task": task,
        **metadata,
        "evaluations": {name: dict(entry) for name, entry in evaluations.items()},
        "scalars": dict(scalars or {}),
    }


def write_metrics(
    path: str | Path,
    evaluations: Mapping[str, Mapping[str, Any]],
    *,
    model: str | None = None,
    task: str | None = None,
    scalars: Mapping[str, Any] | None = None,
    **metadata: Any,
) -> Path:
    """Write a ``metrics.json`` (see the module docstring) atomically; returns ``path``.

    ``evaluations`` maps names to entries (:func:`evaluation_entry`); ``metadata`` are further top-level fields.
    """
    document = metrics_document(evaluations, model=model, task=task, scalars=scalars, **metadata)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        text = json.dumps(document, indent=1, allow_nan=False)
    except (TypeError, ValueError) as err:
        raise ValueError(f"metrics for {path} are not plain finite JSON values: {err}") from None
    write_atomically(path, text)
    return path


def read_metrics(path: str | Path) -> dict[str, Any]:
    """A ``metrics.json`` written by :func:`write_metrics`, validated; ``ValueError`` naming the file otherwise."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"metrics file {path} does not exist (or is not a file)")
    try:
        document = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"metrics file {path} is not valid JSON: {err}") from None
    found = document.get("format") if isinstance(document, dict) else None
    if found != METRICS_FORMAT:
        raise ValueError(
            f"metrics file {path} has format {found!r}, expected {METRICS_FORMAT!r} (written by hf_icl's "
            f"write_metrics: hf-icl train, hf-icl evaluate or the Garg suite)"
        )
    try:
        metrics_document(
            document.get("evaluations"),
            **{k: v for k, v in document.items() if k not in ("format", "evaluations")},
        )
    except ValueError as err:
        raise ValueError(f"metrics file {path}: {err}") from None
    return document


def write_curve_csv(path: str | Path, evaluation: Mapping[str, Any] | ContextScalingResult) -> Path:
    """Write one evaluation's curves (an entry or a result) as CSV: columns n_examples, predictor, mean,
    lower, upper; one row per predictor and position. Returns ``path``."""
    if isinstance(evaluation, ContextScalingResult):
        predictors = predictor_curves(evaluation)
    else:
        check_entry(evaluation, "evaluation")
        predictors = evaluation["predictors"]
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as stream:
        writer = csv.writer(stream)
        writer.writerow(["n_examples", "predictor", *CURVE_FIELDS])
        for name, curve in predictors.items():
            for i, values in enumerate(zip(*(curve[f] for f in CURVE_FIELDS), strict=True)):
                writer.writerow([i, name, *(repr(float(v)) for v in values)])
    return path


def is_flat_scalar(value: Any) -> bool:
    """Strings, numbers, booleans and None: what fits in one table cell (lists and dicts do not)."""
    return value is None or isinstance(value, (str, bool, int, float))


def model_identity(folder: str | Path) -> str:
    """A sha256 naming the model in ``folder`` (its config, weights, training arguments): a retrain changes it.

    It hashes the table of the model files' sha256: from ``manifest.json`` when the folder has one (hf-icl train
    writes it, so the weights are not read again; loaders refuse a folder whose files no longer match it), else
    computed from the files. ``ModelFolderError`` (a ``ValueError``) when the folder holds no model.
    """
    from ..modeling.manifest import sha256_file
    from ..modeling.model_folder import model_files, read_model_manifest

    folder = Path(folder)
    manifest = read_model_manifest(folder)
    if manifest is not None:
        digests = {name: listed["sha256"] for name, listed in manifest["files"].items()}
    else:
        digests = {name: sha256_file(folder / name) for name in model_files(folder)}
    return hashlib.sha256(json.dumps(digests, sort_keys=True).encode()).hexdigest()


def evaluated_model(source: str | Path) -> dict[str, str]:
    """The entry fields naming the model an evaluation runs on: its resolved folder and :func:`model_identity`;
    ``{}`` for a Hub id (no folder of runs holds it)."""
    folder = Path(source)
    if not folder.is_dir():
        return {}
    return {MODEL_FOLDER: str(folder.resolve()), MODEL_IDENTITY: model_identity(folder)}


def record_evaluated_model(path: str | Path, model: Mapping[str, str], names: list[str] | None = None) -> None:
    """Add ``model`` (:func:`evaluated_model`) to the evaluations ``names`` (default: all) of the ``metrics.json``
    at ``path`` that record no model yet: a recorded one names the model those curves came from, so it stays."""
    if not model:
        return
    document = read_metrics(path)
    evaluations = document["evaluations"]
    for name in evaluations if names is None else names:
        if MODEL_FOLDER not in evaluations[name]:
            evaluations[name].update(model)
    write_metrics(path, evaluations, **{k: v for k, v in document.items() if k not in ("format", "evaluations")})


def read_runs(directory: str | Path):
    """Every ``metrics.json`` under ``directory`` (recursively) as one ``pandas.DataFrame``.

    One row per (run, evaluation, predictor, position), with columns :data:`RUN_COLUMNS` (``run`` is the
    file's folder relative to ``directory``, ``"."`` for ``directory`` itself; ``value`` is the curve's mean),
    then the flat scalars of the evaluation entry (``n_prompts``, ``seed``, ...), of the document's top level
    (``model``, ``task``, ...) and of its ``"scalars"``; a name already present keeps its first value.

    ``model_run`` ties evaluations to models: a run whose folder holds a model (``config.json``, as ``hf-icl
    train`` writes) has its own name there; an evaluation that records its ``model_folder`` (``hf-icl evaluate``)
    has the name of the run in that folder when its model is still the one evaluated (same :func:`model_identity`),
    ``"RUN (retrained since)"`` when it is not, and ``"FOLDER (not read)"`` when no run read is in that folder.
    Rows are in the order of the runs' folders, each evaluation of a run read placed right after that run.

    Raises:
        ValueError: ``directory`` is not a directory, or a ``metrics.json`` under it is not of format
            ``hf_icl.metrics/1`` (the error names the file).
    """
    import pandas as pd  # pandas is needed for this table only

    root = Path(directory)
    if not root.is_dir():
        raise ValueError(f"directory {str(directory)!r} is not a directory (expected a folder of runs)")
    paths = sorted(root.rglob(METRICS_FILE))
    runs = [path.parent.relative_to(root).as_posix() for path in paths]
    position = {run: i for i, run in enumerate(runs)}
    run_in = {path.parent.resolve(): run for path, run in zip(paths, runs, strict=True)}
    identity = functools.cache(current_identity)  # one hash per model folder, however many evaluations name it
    ordered = []  # (position of the run a row sits with, whether it is another run's, position of its run, row)
    for path, run in zip(paths, runs, strict=True):
        document = read_metrics(path)
        own = run if (path.parent / "config.json").is_file() else None  # a training run: its folder holds a model
        run_fields = {k: v for k, v in document.items() if k not in ("format", "evaluations") and is_flat_scalar(v)}
        scalar_fields = {k: v for k, v in document["scalars"].items() if is_flat_scalar(v)}
        for evaluation, entry in document["evaluations"].items():
            entry_fields = {k: v for k, v in entry.items() if k != "metric" and is_flat_scalar(v)}
            model_run, anchor = model_link(entry, run_in, identity) if MODEL_FOLDER in entry else (own, None)
            for predictor, curve in entry["predictors"].items():
                for i, (mean, lower, upper) in enumerate(zip(*(curve[f] for f in CURVE_FIELDS), strict=True)):
                    row = dict(
                        zip(
                            RUN_COLUMNS,
                            (run, evaluation, predictor, i, mean, lower, upper, entry["metric"]),
                            strict=True,
                        )
                    )
                    if model_run is not None:
                        row["model_run"] = model_run
                    for fields in (entry_fields, run_fields, scalar_fields):
                        for key, value in fields.items():
                            row.setdefault(key, value)
                    home = anchor or run
                    ordered.append((position[home], home != run, position[run], row))
    rows = [row for *_, row in sorted(ordered, key=lambda item: item[:3])]  # stable: curves keep their order
    if not rows:
        return pd.DataFrame(columns=list(RUN_COLUMNS))
    table = pd.DataFrame.from_records(rows)
    return table[list(RUN_COLUMNS) + [c for c in table.columns if c not in RUN_COLUMNS]]


def current_identity(folder: Path) -> str | None:
    """:func:`model_identity` of ``folder`` now; None when it holds no readable model any more."""
    try:
        return model_identity(folder)
    except (ValueError, OSError):
        return None


def model_link(entry: Mapping[str, Any], run_in: Mapping[Path, str], identity) -> tuple[str, str | None]:
    """``(model_run, the run read in its model folder or None)`` of an evaluation recording its model folder."""
    folder = Path(entry[MODEL_FOLDER])
    run = run_in.get(folder)
    if run is None:
        return f"{folder} (not read)", None
    if identity(folder) != entry.get(MODEL_IDENTITY):
        return f"{run} (retrained since)", run
    return run, run
