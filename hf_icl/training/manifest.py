"""``manifest.json`` of a checkpoint: re-exported from :mod:`hf_icl.modeling.manifest` (where the model loaders,
one layer down, verify final model folders with the same primitives).

Every checkpoint directory carries a manifest with the format name and version, the step, the full training
arguments and the sha256 and size of every other file in the directory. Resuming verifies the manifest before
anything is read, and a missing, truncated or altered file is a one-line :class:`CheckpointError` that names it.
The manifest is an unkeyed sha256 list: it catches accidents (truncation, disk errors, a partial copy, a file
edited by mistake), not a deliberate edit that rewrites the manifest too.
"""

from __future__ import annotations

from ..modeling.manifest import (  # noqa: F401  (re-exported: every import from here keeps working)
    FORMAT_NAME,
    FORMAT_VERSION,
    MANIFEST_FILE,
    MODEL_FORMAT_NAME,
    MODEL_FORMAT_VERSION,
    CheckpointError,
    check_checkpoint_manifest,
    check_manifest_files,
    checkpoint_files,
    file_entry,
    is_inner_path,
    read_manifest,
    reject_json_constant,
    sha256_file,
    verify_checkpoint,
    verify_listed_files,
    write_manifest,
)
