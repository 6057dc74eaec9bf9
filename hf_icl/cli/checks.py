"""Checks made before any work, shared by every ``hf-icl`` command: each failure is a :class:`CLIError`, printed as
one line on stderr with exit status 2. Also the help formatter the command parsers (and ``hf-icl train``'s) use.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from ..options import DefaultsFormatter
from ..validation import one_line

#: the width stored help texts are rendered at (argparse reads COLUMNS)
HELP_WIDTH = 100


@contextlib.contextmanager
def fixed_width() -> Iterator[None]:
    """argparse formats at :data:`HELP_WIDTH` columns inside the block, whatever the terminal."""
    previous = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(HELP_WIDTH)
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = previous


def help_formatter(prog):
    return DefaultsFormatter(prog, max_help_position=36)


class CLIError(ValueError):
    """An expected failure of a command: printed as ``hf-icl <command>: error: ...``, exit status 2."""


def existing_file(flag: str, path: str) -> Path:
    """A file to read: it must exist, be a file and be readable."""
    target = Path(path).expanduser()
    if not target.exists():
        raise CLIError(f"{flag} {path}: no such file")
    if not target.is_file():
        raise CLIError(f"{flag} must be a file, got the directory {path}")
    if not os.access(target, os.R_OK):
        raise CLIError(f"{flag} {path}: the file is not readable (permission denied)")
    return target


def writable(flag: str, path: str, *, directory: bool) -> None:
    """A directory (``directory``) or a file to write: what exists of it must be of that kind, and the
    deepest existing ancestor a writable directory (missing directories are created)."""
    target = Path(path).expanduser()
    kind = "a directory (created if missing)" if directory else "a file path"
    if target.exists() and target.is_dir() != directory:
        got = "an existing file" if directory else "an existing directory"
        raise CLIError(f"{flag} must be {kind}, got {got}: {path}")
    for ancestor in target.parents:
        if ancestor.exists():
            if not ancestor.is_dir():
                raise CLIError(f"{flag} {path}: {ancestor} is a file, so nothing can be created below it")
            if not os.access(ancestor, os.W_OK):
                raise CLIError(f"{flag} {path}: {ancestor} is not writable (permission denied)")
            break


def parse_device(flag: str, name: str | None):
    """``name`` as a ``torch.device`` that exists on this machine (None stays None)."""
    from ..validation import check_device

    try:
        return check_device(flag, name)
    except ValueError as err:
        raise CLIError(str(err)) from None


def hub_offline() -> bool:
    """Whether Hugging Face Hub access is switched off (HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE)."""
    for variable in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        if os.environ.get(variable, "").strip().upper() in {"1", "ON", "YES", "TRUE"}:
            return True
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def model_source(flag: str, name: str, *, needs: str | None = "config.json") -> str:
    """A local model directory (resolved), or a Hub id that can be reached (or is cached); else a ``CLIError``.

    ``needs``: a file a local directory must hold (``None``: any directory, e.g. a tokenizer's).
    """
    path = Path(name).expanduser()
    if path.exists():
        if not path.is_dir():
            raise CLIError(f"{flag} must be a directory written by save_pretrained (or a Hub id), got the file {name}")
        if needs and not (path / needs).is_file():
            raise CLIError(f"{flag} {name}: the directory has no {needs}, so it holds no saved model")
        return str(path.resolve())
    from huggingface_hub import try_to_load_from_cache
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(name)
    except HFValidationError:
        raise CLIError(f"{flag} {name}: no such directory (nor a Hub id like 'user/model')") from None
    if hub_offline() and not isinstance(try_to_load_from_cache(name, needs or "config.json"), str):
        raise CLIError(
            f"{flag} {name!r} is not a local directory, and the Hugging Face Hub cannot be reached in offline "
            "mode (HF_HUB_OFFLINE=1) nor is it cached; pass the local path of a saved model"
        )
    return name


def load_config(flag: str, name: str, source: str, **kwargs):
    """``AutoConfig.from_pretrained(source, **kwargs)``; a Hub that cannot be reached becomes a ``CLIError``."""
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(source, **kwargs)
    except OSError as err:
        if Path(source).exists():
            raise
        raise CLIError(
            f"{flag} {name!r}: could not load it from the Hugging Face Hub ({one_line(err)}); "
            "if you are offline, pass the local path of a saved model"
        ) from None


def check_estimator_names(names: list[str] | None) -> None:
    if names is None:
        return
    for name in names:
        if not name:
            raise CLIError(f"--estimators must be comma-separated names without empty entries, got {','.join(names)!r}")
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise CLIError(f"--estimators must not repeat a name (one curve each), got {repeated[0]!r} twice")


def allocation_error(err: BaseException, argv: list[str]) -> BaseException:
    """A ``CLIError`` naming the numeric flags given in ``argv`` if ``err`` is a failed memory allocation (torch's
    ``RuntimeError`` / ``OutOfMemoryError``, ``MemoryError``); ``err`` itself otherwise."""
    from ..validation import allocation_failure

    failure = allocation_failure(err)
    if failure is None:
        return err
    pairs = zip(argv, argv[1:], strict=False)
    sizes = [f"{flag} {value}" for flag, value in pairs if flag.startswith("--") and _numeric(value)]
    hint = f"reduce the sizes given ({', '.join(sizes)})" if sizes else "use smaller sizes"
    return CLIError(f"{failure}; {hint}")


def _numeric(text: str) -> bool:
    try:
        float(text.split(",")[0])
    except ValueError:
        return False
    return True


def flag_spelling(message: str, fields) -> str:
    """``name=value`` of a training argument in ``message`` as its flag: ``--name`` for ``True``, ``--name value``
    otherwise (quotes dropped, kept where the value needs them in a shell).

    >>> flag_spelling("overwrite_output_dir=True with resume_from_checkpoint='latest'", ["overwrite_output_dir",
    ...     "resume_from_checkpoint"])
    '--overwrite_output_dir with --resume_from_checkpoint latest'
    """
    import re
    import shlex

    names = "|".join(sorted(map(re.escape, fields), key=len, reverse=True))

    def flag(match: re.Match) -> str:
        name, value = match.group(1), match.group(2)
        if value == "True":
            return f"--{name}"
        if value[:1] in "'\"" and value[-1:] == value[:1]:
            value = shlex.quote(value[1:-1])
        return f"--{name} {value}"

    return re.sub(rf"(?<![\w-])({names})=('[^']*'|\"[^\"]*\"|[^\s,;:)]+)", flag, message)
