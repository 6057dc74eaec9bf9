"""Model folders that are checked before a single weight is used.

:func:`verify_model_folder` is what every hf_icl loader runs on a local folder (``from_pretrained`` of every hf_icl
model, so ``AutoModel.from_pretrained`` too; ``hf-icl evaluate`` and ``hf-icl push`` before any other work):

1. **the manifest**, where the folder has one (a checkpoint's ``hf_icl-checkpoint`` manifest, or the
   ``hf_icl-model`` manifest :func:`write_model_manifest` writes into a final model folder): every listed file
   has its size and sha256;
2. **the safetensors headers**, parsed here (8-byte little-endian length, a JSON object of tensors with dtype,
   shape and data offsets): a truncated file or a crafted header is refused before safetensors reads it;
3. **config against weights**: the model ``config.json`` describes, built on the ``meta`` device (no memory, no
   initialisation), must have exactly the weights' keys and shapes (tied copies that ``save_pretrained``
   drops aside); a config with a layer fewer or more, or other sizes, names the keys that differ;
4. **finite weights**: every floating tensor holds no NaN or infinity.

Each failure is a :class:`ModelFolderError` (a ``ValueError``) with a one-line message naming the folder, the
file and what is wrong. The manifest is an unkeyed sha256 list: it guards against accidents (truncation, disk
errors, a partial copy, a file edited by mistake), not against a deliberate edit that rewrites it too.
"""

from __future__ import annotations

import copy
import json
import math
import struct
from pathlib import Path
from typing import Any

import torch

from ..validation import one_line
from .manifest import (
    FORMAT_NAME,
    MANIFEST_FILE,
    MODEL_FORMAT_NAME,
    MODEL_FORMAT_VERSION,
    CheckpointError,
    check_checkpoint_manifest,
    check_manifest_files,
    file_entry,
    is_inner_path,
    load_manifest_json,
    reject_json_constant,
    verify_listed_files,
)

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
WEIGHTS_INDEX_FILE = "model.safetensors.index.json"
#: the files of a final model folder that are not weights and that its manifest lists when present
MODEL_EXTRA_FILES = ("generation_config.json", "training_args.json")
#: safetensors dtypes and their size in bytes (the 4- and 6-bit formats are not loaded by hf_icl)
SAFETENSORS_DTYPES = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "F8_E8M0": 1,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "I64": 8,
    "U64": 8,
    "F64": 8,
    "C64": 8,
}
MAX_HEADER_BYTES = 100_000_000  # safetensors' own limit
_SHOWN = 5  # keys named in a mismatch message


class ModelFolderError(CheckpointError):
    """A model folder that cannot be trusted: a file its manifest does not match, a damaged or crafted safetensors
    file, weights that do not fit its config, or non-finite weights (a one-line message naming the file)."""


# -- the manifest of a final model folder -----------------------------------------------------------------------
def model_files(folder: str | Path) -> list[str]:
    """The model files of ``folder`` a model manifest lists: config, weights (one file or index + shards),
    generation config and training arguments when present."""
    folder = Path(folder)
    where = f"model folder {folder}"
    if not (folder / CONFIG_FILE).is_file():
        raise ModelFolderError(f"{where}: {CONFIG_FILE} is missing (not a folder written by save_pretrained)")
    names = [CONFIG_FILE, *weight_files(folder)]
    names += [name for name in MODEL_EXTRA_FILES if (folder / name).is_file()]
    return names


def write_model_manifest(folder: str | Path) -> dict[str, Any]:
    """Write ``manifest.json`` into a final model folder: the sha256 and size of its model files.

    The files: ``config.json``, ``model.safetensors`` (or ``model.safetensors.index.json`` and its shards),
    ``generation_config.json`` and ``training_args.json`` when present; the card, plots and metrics are not
    listed (they may be rewritten without touching the model). Call it after the last of those files is
    written. A checkpoint folder keeps its own manifest: refused.
    """
    folder = Path(folder)
    where = f"model folder {folder}"
    path = folder / MANIFEST_FILE
    if path.is_file():
        try:
            existing = json.loads(path.read_text())
        except (UnicodeDecodeError, ValueError):
            existing = None
        if isinstance(existing, dict) and existing.get("format") == FORMAT_NAME:
            raise ModelFolderError(
                f"{where}: {MANIFEST_FILE} is a checkpoint's manifest (format {FORMAT_NAME!r}); it is not replaced"
            )
    manifest = {
        "format": MODEL_FORMAT_NAME,
        "format_version": MODEL_FORMAT_VERSION,
        "files": {name: file_entry(folder / name) for name in model_files(folder)},
    }
    path.write_text(json.dumps(manifest, indent=2, allow_nan=False) + "\n")
    return manifest


def read_model_manifest(folder: str | Path) -> dict[str, Any] | None:
    """The parsed manifest of ``folder`` (a checkpoint's or a model's), its structure checked; None if it has none."""
    folder = Path(folder)
    where = f"model folder {folder}"
    if not (folder / MANIFEST_FILE).exists():
        return None
    manifest = load_manifest_json(folder, where, ModelFolderError)
    kind = manifest.get("format")
    if kind == FORMAT_NAME:
        return check_checkpoint_manifest(manifest, where, ModelFolderError)
    if kind != MODEL_FORMAT_NAME:
        raise ModelFolderError(
            f"{where}: {MANIFEST_FILE} has format {kind!r}, not {MODEL_FORMAT_NAME!r} (nor {FORMAT_NAME!r})"
        )
    if manifest.get("format_version") != MODEL_FORMAT_VERSION:
        raise ModelFolderError(
            f"{where}: {MANIFEST_FILE} has format_version {manifest.get('format_version')!r}; this hf_icl reads "
            f"version {MODEL_FORMAT_VERSION}"
        )
    check_manifest_files(manifest, where, ModelFolderError)
    return manifest


# -- the check ---------------------------------------------------------------------------------------------------
def verify_model_folder(folder: str | Path, config=None, *, model_class=None, check_shapes: bool = True) -> None:
    """Check a saved model folder before it is loaded; raise :class:`ModelFolderError` naming what is wrong.

    Args:
        folder: a local folder written by ``save_pretrained`` (a final model folder or a checkpoint).
        config: the ``PretrainedConfig`` the weights must fit (default: the folder's ``config.json``).
        model_class: the class to build from the config when ``config.architectures`` names none that hf_icl or
            transformers knows for this config (the loaders pass the class being loaded).
        check_shapes: False lets mis-shaped keys pass (``from_pretrained(..., ignore_mismatched_sizes=True)``
            reinitialises them); missing and unexpected keys are still errors.

    Checks, in order: the manifest where there is one (every listed file's size and sha256), the safetensors
    headers (parsed here), the config's model (built on the ``meta`` device) against the weights key by key and
    shape by shape, and that every floating weight is finite.
    """
    folder = Path(folder)
    where = f"model folder {folder}"
    if not folder.is_dir():
        raise ModelFolderError(f"{where}: no such directory")
    manifest = read_model_manifest(folder)
    if manifest is not None:
        verify_listed_files(folder, manifest, where, ModelFolderError)
        for name in [CONFIG_FILE, *weight_files(folder)]:
            if name not in manifest["files"]:
                raise ModelFolderError(
                    f"{where}: {name} is present but not listed in {MANIFEST_FILE} (a stale manifest: if the "
                    "files are right, rewrite it with hf_icl.modeling.model_folder.write_model_manifest)"
                )
    if not (folder / CONFIG_FILE).is_file():
        raise ModelFolderError(f"{where}: {CONFIG_FILE} is missing (not a folder written by save_pretrained)")
    headers = read_weight_headers(folder)
    if config is None:
        config = _load_config(folder)
    expected = expected_shapes(folder, config, model_class)
    _compare(folder, headers, expected, check_shapes=check_shapes)
    check_finite_weights(folder, headers)


def weight_files(folder: str | Path) -> list[str]:
    """The weight files of ``folder``: ``[model.safetensors]`` or the index and the shards it names."""
    folder = Path(folder)
    where = f"model folder {folder}"
    if (folder / WEIGHTS_FILE).is_file():
        return [WEIGHTS_FILE]
    if (folder / WEIGHTS_INDEX_FILE).is_file():
        return [WEIGHTS_INDEX_FILE, *sorted(set(_weight_map(folder).values()))]
    raise ModelFolderError(
        f"{where}: holds neither {WEIGHTS_FILE} nor {WEIGHTS_INDEX_FILE} (hf_icl loads safetensors weights only)"
    )


def _weight_map(folder: Path) -> dict[str, str]:
    where = f"model folder {folder}: {WEIGHTS_INDEX_FILE}"
    try:
        index = json.loads((folder / WEIGHTS_INDEX_FILE).read_text(), parse_constant=reject_json_constant)
    except (UnicodeDecodeError, ValueError) as err:
        raise ModelFolderError(f"{where} is not valid JSON ({one_line(err)})") from None
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise ModelFolderError(f"{where} has no weight_map object naming the shard of each weight")
    for key, shard in weight_map.items():
        if not is_inner_path(shard) or not shard.endswith(".safetensors"):
            raise ModelFolderError(f"{where} maps {key!r} to {shard!r}, not a .safetensors file inside the folder")
        if not (folder / shard).is_file():
            raise ModelFolderError(f"{where} maps {key!r} to the shard {shard}, which is missing")
    return weight_map


def read_weight_headers(folder: str | Path) -> dict[str, tuple[str, str, tuple[int, ...]]]:
    """``{key: (file, dtype, shape)}`` of every weight in ``folder``, from safetensors headers checked here."""
    folder = Path(folder)
    if not (folder / WEIGHTS_FILE).is_file() and (folder / WEIGHTS_INDEX_FILE).is_file():
        weight_map = _weight_map(folder)
        found: dict[str, tuple[str, str, tuple[int, ...]]] = {}
        for shard in sorted(set(weight_map.values())):
            for key, (dtype, shape) in read_safetensors_header(folder / shard, where=f"model folder {folder}").items():
                if weight_map.get(key) != shard:
                    raise ModelFolderError(
                        f"model folder {folder}: the shard {shard} holds {key!r}, which {WEIGHTS_INDEX_FILE} "
                        f"maps to {weight_map.get(key)!r}"
                    )
                found[key] = (shard, dtype, shape)
        absent = [key for key in weight_map if key not in found]
        if absent:
            raise ModelFolderError(
                f"model folder {folder}: {WEIGHTS_INDEX_FILE} lists {len(absent)} weights no shard holds: "
                f"{_names(absent)}"
            )
        return found
    (name,) = weight_files(folder)
    header = read_safetensors_header(folder / name, where=f"model folder {folder}")
    return {key: (name, dtype, shape) for key, (dtype, shape) in header.items()}


def read_safetensors_header(path: str | Path, where: str | None = None) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Parse and check the header of the safetensors file ``path``: ``{key: (dtype, shape)}``.

    Refused (:class:`ModelFolderError`): a file shorter than the 8-byte length, a header length beyond the file,
    a header that is not a UTF-8 JSON object, duplicate keys, an unknown dtype, a shape that is not a list of
    non-negative integers, data offsets that are not ``[begin, end]`` within the data, that overlap or leave a
    gap, or that disagree with shape × dtype size. Nothing is read but the header.
    """
    path = Path(path)
    name = path.name if where else str(path)
    prefix = f"{where}: {name}" if where else name
    size = path.stat().st_size
    with open(path, "rb") as handle:
        raw = handle.read(8)
        if len(raw) < 8:
            raise ModelFolderError(f"{prefix} has {size} bytes: too short for a safetensors file (truncated?)")
        (length,) = struct.unpack("<Q", raw)
        if length > size - 8 or length > MAX_HEADER_BYTES:
            raise ModelFolderError(
                f"{prefix}: the safetensors header length is {length} bytes but the file has {size - 8} after it "
                "(truncated or not a safetensors file)"
            )
        text = handle.read(length)
    try:
        header = json.loads(text.decode("utf-8"), object_pairs_hook=_no_duplicates, parse_constant=reject_json_constant)
    except (UnicodeDecodeError, ValueError) as err:
        raise ModelFolderError(f"{prefix}: the safetensors header is not valid JSON ({one_line(err)})") from None
    if not isinstance(header, dict):
        raise ModelFolderError(f"{prefix}: the safetensors header is a JSON {type(header).__name__}, not an object")
    metadata = header.pop("__metadata__", {})
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise ModelFolderError(f"{prefix}: the safetensors __metadata__ must map names to strings")
    data_bytes = size - 8 - length
    tensors: dict[str, tuple[str, tuple[int, ...]]] = {}
    spans = []
    for key, info in header.items():
        if not isinstance(info, dict) or set(info) != {"dtype", "shape", "data_offsets"}:
            raise ModelFolderError(f"{prefix}: tensor {key!r} must have exactly dtype, shape and data_offsets")
        dtype, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
        if dtype not in SAFETENSORS_DTYPES:
            raise ModelFolderError(
                f"{prefix}: tensor {key!r} has dtype {dtype!r}, not one of {sorted(SAFETENSORS_DTYPES)}"
            )
        if not isinstance(shape, list) or not all(_is_count(n) for n in shape):
            raise ModelFolderError(f"{prefix}: tensor {key!r} has shape {shape!r}, not a list of integers >= 0")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_count(n) for n in offsets)):
            raise ModelFolderError(f"{prefix}: tensor {key!r} has data_offsets {offsets!r}, not [begin, end]")
        begin, end = offsets
        if not begin <= end <= data_bytes:
            raise ModelFolderError(
                f"{prefix}: tensor {key!r} has data_offsets {offsets} outside the {data_bytes} data bytes of the "
                "file (truncated or a crafted header)"
            )
        nbytes = math.prod(shape) * SAFETENSORS_DTYPES[dtype]
        if nbytes != end - begin:
            raise ModelFolderError(
                f"{prefix}: tensor {key!r} of shape {shape} and dtype {dtype} needs {nbytes} bytes, its data_offsets "
                f"{offsets} hold {end - begin}"
            )
        tensors[key] = (dtype, tuple(shape))
        spans.append((begin, end, key))
    position = 0
    for begin, end, key in sorted(spans):
        if begin != position:
            what = "overlaps the tensor before it" if begin < position else f"leaves a gap of {begin - position} bytes"
            raise ModelFolderError(f"{prefix}: tensor {key!r} (data_offsets [{begin}, {end}]) {what}")
        position = end
    if position != data_bytes:
        raise ModelFolderError(
            f"{prefix}: its tensors hold {position} bytes but the file has {data_bytes} after the header"
        )
    return tensors


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for key, value in pairs:
        if key in found:
            raise ValueError(f"the key {key!r} appears twice")
        found[key] = value
    return found


def _load_config(folder: Path):
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(folder)
    except OSError as err:
        raise ModelFolderError(f"model folder {folder}: {CONFIG_FILE} cannot be read ({one_line(err)})") from None


def resolve_model_class(config, model_class=None):
    """The class whose weights ``config`` describes: the first of ``config.architectures`` that hf_icl or
    transformers defines for this config, else ``model_class``, else the ``AutoModel`` (or causal-LM) class."""
    import transformers
    from transformers import AutoModel, AutoModelForCausalLM, PreTrainedModel

    for name in (getattr(config, "architectures", None) or [])[:1]:
        if not isinstance(name, str) or not name.isidentifier():
            continue
        # hf_icl's classes are defined by the time a folder is loaded (importing hf_icl registers them): found
        # among the subclasses, so this module needs no import of the model modules that import it
        ours = [c for c in _subclasses(PreTrainedModel) if c.__module__.startswith("hf_icl.")]
        candidates = [c for c in ours if c.__name__ == name]
        try:
            candidates.append(getattr(transformers, name, None))
        except Exception:  # a transformers class whose optional dependency is missing
            pass
        for found in candidates:
            if (
                isinstance(found, type)
                and issubclass(found, PreTrainedModel)
                and isinstance(config, found.config_class)
            ):
                return found
    if model_class is not None:
        return model_class
    for auto in (AutoModel, AutoModelForCausalLM):
        try:
            return auto._model_mapping[type(config)]
        except (KeyError, ValueError):
            continue
    return None


def _subclasses(cls: type):
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


def expected_shapes(folder: str | Path, config, model_class=None) -> dict[str, Any]:
    """The keys and shapes a saved model of ``config`` holds: the model built on the ``meta`` device.

    Returns ``{"shapes": {key: shape}, "optional": set of keys that may be absent (tied copies, keys the class
    ignores when missing), "ignore_unexpected": regex patterns the class ignores when unexpected,
    "class": the class's name}``.
    """
    import re

    folder = Path(folder)
    cls = resolve_model_class(config, model_class)
    if cls is None:
        raise ModelFolderError(
            f"model folder {folder}: {CONFIG_FILE} has model_type {getattr(config, 'model_type', None)!r}, for "
            "which no model class is known (import hf_icl first for its models)"
        )
    try:
        with torch.device("meta"):
            model = cls(copy.deepcopy(config))  # building may set fields on the config: not on the caller's
    except (ValueError, TypeError, AttributeError, RuntimeError) as err:
        raise ModelFolderError(
            f"model folder {folder}: {CONFIG_FILE} does not build a {cls.__name__} ({one_line(err)})"
        ) from None
    shapes = {key: tuple(tensor.shape) for key, tensor in model.state_dict().items()}
    tied = getattr(model, "all_tied_weights_keys", None) or {}
    optional = set(tied)
    ignore_missing = list(getattr(model, "_keys_to_ignore_on_load_missing", None) or [])
    optional |= {key for key in shapes if any(re.search(p, key) for p in ignore_missing)}
    ignore_unexpected = list(getattr(model, "_keys_to_ignore_on_load_unexpected", None) or [])
    return {"shapes": shapes, "optional": optional, "ignore_unexpected": ignore_unexpected, "class": cls.__name__}


def _compare(folder: Path, headers: dict, expected: dict, *, check_shapes: bool) -> None:
    import re

    shapes, cls = expected["shapes"], expected["class"]
    saved = {key: shape for key, (_, _, shape) in headers.items()}
    saved = _align_prefix(saved, shapes)
    files = sorted({file for file, _, _ in headers.values()})
    weights = files[0] if len(files) == 1 else WEIGHTS_INDEX_FILE
    where = f"model folder {folder}: {CONFIG_FILE} and {weights} disagree"
    unexpected = [
        key for key in saved if key not in shapes and not any(re.search(p, key) for p in expected["ignore_unexpected"])
    ]
    if unexpected:
        raise ModelFolderError(
            f"{where}: the weights hold {len(unexpected)} tensors that the {cls} built from {CONFIG_FILE} does not "
            f"have: {_names(unexpected)}"
        )
    missing = [key for key in shapes if key not in saved and key not in expected["optional"]]
    if missing:
        raise ModelFolderError(
            f"{where}: the {cls} built from {CONFIG_FILE} has {len(missing)} weights that the file lacks: "
            f"{_names(missing)}"
        )
    if check_shapes:
        wrong = [f"{key} {list(saved[key])} vs {list(shapes[key])}" for key in saved if saved[key] != shapes[key]]
        if wrong:
            raise ModelFolderError(
                f"{where}: {len(wrong)} weights have another shape than the {cls} built from {CONFIG_FILE} "
                f"(saved vs config): {_names(wrong)}"
            )


def _align_prefix(saved: dict[str, tuple], shapes: dict[str, tuple]) -> dict[str, tuple]:
    """Weights of a base model loaded into a model with a head (or the reverse): keys with or without the
    base-model prefix, as ``from_pretrained`` maps them (only when no key matches as saved)."""
    if not saved or set(saved) & set(shapes):
        return saved
    model_prefixes = {key.split(".", 1)[0] for key in shapes if "." in key}
    saved_prefixes = {key.split(".", 1)[0] for key in saved if "." in key}
    for prefix in sorted(model_prefixes):
        added = {f"{prefix}.{key}": shape for key, shape in saved.items()}
        if set(added) & set(shapes):
            return added
    for prefix in sorted(saved_prefixes):
        stripped = {key[len(prefix) + 1 :] if key.startswith(prefix + ".") else key: s for key, s in saved.items()}
        if set(stripped) & set(shapes):
            return stripped
    return saved


def first_non_finite_weight(folder: str | Path, headers: dict | None = None) -> tuple[str, str, int, int] | None:
    """``(file, key, non-finite count, size)`` of the first floating weight holding a NaN or an infinity, read from
    disk; None if every weight is finite. An unreadable file is a :class:`ModelFolderError`."""
    from safetensors import SafetensorError, safe_open

    folder = Path(folder)
    headers = read_weight_headers(folder) if headers is None else headers
    by_file: dict[str, list[str]] = {}
    for key, (file, _, _) in headers.items():
        by_file.setdefault(file, []).append(key)
    for file, keys in sorted(by_file.items()):
        try:
            with safe_open(str(folder / file), framework="pt") as handle:
                for key in sorted(keys):
                    tensor = handle.get_tensor(key)
                    if not tensor.is_floating_point() or tensor.numel() == 0:
                        continue
                    if tensor.element_size() == 1:
                        tensor = tensor.float()  # isfinite has no 8-bit float kernels
                    count = int((~torch.isfinite(tensor)).sum())
                    if count:
                        return file, key, count, tensor.numel()
        except SafetensorError as err:  # the header check passed, so this is a read error of the data
            raise ModelFolderError(f"model folder {folder}: {file} cannot be read ({one_line(err)})") from None
    return None


def check_finite_weights(folder: str | Path, headers: dict | None = None) -> None:
    """Raise :class:`ModelFolderError` naming the first floating weight holding a NaN or an infinity."""
    found = first_non_finite_weight(folder, headers)
    if found is not None:
        file, key, count, size = found
        raise ModelFolderError(
            f"model folder {folder}: {file}: the weight {key!r} holds {count} non-finite "
            f"value{'s' if count > 1 else ''} (NaN or infinity) of {size}"
        )


def _names(keys: list[str]) -> str:
    shown = ", ".join(keys[:_SHOWN])
    return shown + (f" (and {len(keys) - _SHOWN} more)" if len(keys) > _SHOWN else "")
