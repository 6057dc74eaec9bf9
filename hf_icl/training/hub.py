"""Pushing a trained model folder to the Hugging Face Hub.

:func:`check_hub_access` runs before any training work, so a run that is to be pushed fails in a second
(bad repo id, offline, not logged in, a token the Hub refuses) rather than after hours of training.
:func:`push_model_folder` uploads what a user of the model needs (weights, config, model card, plots,
training arguments, metrics, CSV tables) and never the checkpoints, optimizer states, RNG states, run
lock or tracker logs that a training output directory also holds.

Example (not run here: it needs the network and a token)::

    >>> from hf_icl.training.hub import check_hub_access, push_model_folder
    >>> user = check_hub_access("me/linreg-gpt2")  # doctest: +SKIP
    >>> url = push_model_folder("outputs/linreg", "me/linreg-gpt2")  # doctest: +SKIP
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from huggingface_hub import HfApi, constants, get_token
from huggingface_hub.utils import validate_repo_id

from ..modeling.manifest import MANIFEST_FILE
from ..modeling.model_folder import verify_model_folder
from ..validation import one_line
from .checkpoints import CONFIG_FILE, WEIGHTS_FILE, WEIGHTS_INDEX_FILE
from .model_card import CARD_FILE, set_card_model_id

#: what a model repo receives: the model, its config, the card, plots, training arguments, metrics, CSV tables and
#: the model folder's manifest.json (the sha256 of its model files, so a download can be verified like a local folder)
UPLOAD_PATTERNS = [
    MANIFEST_FILE,
    "*.safetensors",
    WEIGHTS_INDEX_FILE,
    CONFIG_FILE,
    "generation_config.json",
    CARD_FILE,
    "*.png",
    "*.svg",
    "training_args.json",
    "metrics.json",
    "*.csv",
]
#: what a training output directory also holds and a model repo must not: checkpoints (optimizer, scheduler,
#: scaler and RNG states, their manifests), half-written checkpoints, the run lock, tensorboard logs (patterns
#: match paths relative to the folder with fnmatch, whose ``*`` also matches ``/``: these apply at any depth; the
#: folder's own top-level manifest.json is uploaded)
IGNORE_PATTERNS = [
    "checkpoints/*",
    "*.tmp/*",
    "*train.lock*",
    "*optimizer.*",
    "*scheduler.json",
    "*scaler.json",
    "*rng_state_*",
    "*trainer_state.json",
    f"*/{MANIFEST_FILE}",
    "hf_icl/*",
    "*tfevents*",
]
OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")


class HubAccessError(ValueError):
    """The Hub cannot be used for this push: offline mode, no token, or a Hub that refuses the token."""


def check_hub_access(repo_id: str, token: str | None = None, *, api: Any = None) -> str:
    """Check, before any training work, that ``repo_id`` can be pushed to; return the Hub user name.

    Args:
        repo_id: ``"name"`` or ``"namespace/name"``.
        token: a Hub token (default: the logged-in one, ``HF_TOKEN`` or ``hf auth login``).
        api: the ``HfApi`` to ask (default: ``HfApi(token=token)``).

    Raises:
        ValueError: ``repo_id`` is not a valid repo id.
        HubAccessError: offline mode is on, there is no token, the Hub cannot be reached or refuses the
            token, or the namespace is neither the user nor one of their organisations (one-line message).
    """
    check_repo_id(repo_id)
    _refuse_offline()
    token = token or get_token()
    if not token:
        unreachable = hub_unreachable()
        also = f"; and the Hub cannot be reached from here ({unreachable})" if unreachable else ""
        raise HubAccessError(
            f"cannot push to {repo_id!r}: not logged in to the Hugging Face Hub; run `hf auth login`, "
            f"set HF_TOKEN, or pass a token{also}"
        )
    api = HfApi(token=token) if api is None else api
    try:
        identity = api.whoami()
    except Exception as err:  # a network error or a refused token: both end the push before training
        cause = f"{type(err).__name__}: {one_line(err)}"
        if _is_network_error(err):
            raise HubAccessError(
                f"cannot push to {repo_id!r}: the Hugging Face Hub ({constants.ENDPOINT}) cannot be reached ({cause}); "
                "check the network (the token was not checked)"
            ) from None
        raise HubAccessError(f"cannot push to {repo_id!r}: the Hub did not accept the token ({cause})") from None
    user = identity.get("name")
    namespace = repo_id.split("/")[0] if "/" in repo_id else user
    allowed = [user, *(org.get("name") for org in identity.get("orgs") or [])]
    if namespace not in allowed:
        raise HubAccessError(
            f"cannot push to {repo_id!r}: the token belongs to {user!r}, who can write to {allowed}, "
            f"not to {namespace!r}"
        )
    return user


def push_model_folder(
    folder: str | Path,
    repo_id: str,
    *,
    token: str | None = None,
    private: bool = False,
    commit_message: str | None = None,
    api: Any = None,
    verify: bool = True,
) -> str:
    """Create ``repo_id`` (if needed) and upload the model in ``folder`` to it; return the commit URL.

    ``folder`` must hold a ``save_pretrained`` model (``config.json`` and ``model.safetensors``, or a
    sharded index) and its ``README.md`` card. The card's usage snippet is first pointed at the repo
    (in ``folder`` too), so it runs as written for whoever reads it on the Hub. Only the files matching
    :data:`UPLOAD_PATTERNS` and not :data:`IGNORE_PATTERNS` are uploaded, the folder's ``manifest.json``
    included. With ``verify`` (the default) the folder is first checked as a loader checks it
    (:func:`~hf_icl.modeling.model_folder.verify_model_folder`: its manifest, the safetensors headers, config
    against weights, finite weights), so a damaged model is never published.
    """
    folder = Path(folder)
    check_repo_id(repo_id)
    if not isinstance(private, bool):
        raise ValueError(f"private must be True or False, got {private!r}")
    check_model_folder(folder)
    if verify:
        verify_model_folder(folder)
    _refuse_offline()
    api = HfApi(token=token) if api is None else api
    created = api.create_repo(repo_id, exist_ok=True, private=private, repo_type="model")
    full_id = getattr(created, "repo_id", None) or repo_id  # "name" becomes "user/name"
    set_card_model_id(folder, full_id)
    if commit_message is None:
        model_type = json.loads((folder / CONFIG_FILE).read_text()).get("model_type", "model")
        commit_message = f"Upload {model_type} trained with hf_icl"
    info = api.upload_folder(
        folder_path=str(folder),
        repo_id=full_id,
        repo_type="model",
        commit_message=commit_message,
        allow_patterns=UPLOAD_PATTERNS,
        ignore_patterns=IGNORE_PATTERNS,
    )
    return info.commit_url


def default_repo_name(output_dir: str | Path) -> str:
    """The repo name ``--push_to_hub`` uses without ``--hub_model_id``: the output folder's name.

    >>> default_repo_name("outputs/linreg-gpt2")
    'linreg-gpt2'
    """
    name = Path(output_dir).resolve().name
    try:
        validate_repo_id(name)
    except ValueError as err:
        raise ValueError(
            f"output_dir {str(output_dir)!r} has the folder name {name!r}, which is not a valid Hub repo name "
            f"({one_line(err)}); pass hub_model_id"
        ) from None
    return name


def check_repo_id(repo_id: Any) -> str:
    """Return ``repo_id`` if it is a valid Hub model repo id; raise ``ValueError`` naming it otherwise."""
    if not isinstance(repo_id, str):
        raise ValueError(f"repo_id must be a string 'name' or 'namespace/name', got {repo_id!r}")
    try:
        validate_repo_id(repo_id)
    except ValueError as err:
        raise ValueError(
            f"repo_id {repo_id!r} is not a valid Hub repo id ({one_line(err)}); use 'name' or 'namespace/name' "
            "with letters, digits, '-', '_' and '.'"
        ) from None
    return repo_id


def check_model_folder(folder: Path) -> None:
    """Raise ``ValueError`` naming ``folder`` unless it holds a saved model and its model card."""
    if not folder.is_dir():
        raise ValueError(f"folder {str(folder)!r} is not a directory (expected a model written by save_pretrained)")
    has_weights = (folder / WEIGHTS_FILE).is_file() or (folder / WEIGHTS_INDEX_FILE).is_file()
    missing = [name for name in (CONFIG_FILE, WEIGHTS_FILE) if not (folder / name).is_file()]
    if has_weights and WEIGHTS_FILE in missing:
        missing.remove(WEIGHTS_FILE)  # sharded weights
    if not (folder / CARD_FILE).is_file():
        missing.append(CARD_FILE)
    if missing:
        raise ValueError(
            f"folder {str(folder)!r} lacks {missing}: push a folder written by save_pretrained with its model card "
            "(hf-icl train writes both)"
        )


def _refuse_offline() -> None:
    """Raise ``HubAccessError`` when offline mode is on (read now, and as huggingface_hub read it at import)."""
    on = [name for name in OFFLINE_VARIABLES if os.environ.get(name, "").upper() in constants.ENV_VARS_TRUE_VALUES]
    if on or constants.HF_HUB_OFFLINE:
        where = f"{on[0]}={os.environ[on[0]]}" if on else "huggingface_hub.constants.HF_HUB_OFFLINE"
        raise HubAccessError(f"cannot push to the Hugging Face Hub in offline mode ({where}); unset it to push")


def hub_unreachable(timeout: float = 3.0) -> str | None:
    """Why the Hub's host cannot be reached (a name that does not resolve, a refused or timed-out connection), or
    None when a TCP connection to it opens."""
    import socket
    from urllib.parse import urlparse

    url = urlparse(constants.ENDPOINT)
    host, port = url.hostname or "huggingface.co", url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as err:
        return f"{host}:{port}: {one_line(err)}"
    return None


def _is_network_error(err: BaseException) -> bool:
    """A failure to reach the Hub (DNS, connection, timeout) rather than an answer from it; httpx's and requests'
    transport errors and the OS's alike, matched by class name so neither library needs importing."""
    names = {cls.__name__ for cls in type(err).__mro__}
    transport = {"ConnectError", "ConnectTimeout", "NetworkError", "TransportError", "TimeoutException", "Timeout"}
    return isinstance(err, (ConnectionError, TimeoutError, OSError)) or bool(names & transport)
