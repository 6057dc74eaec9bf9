"""The causal-language-model commands, ``hf-icl niah`` and ``hf-icl perplexity``: loading the model (a folder, a Hub
id or a GGUF file) and its tokenizer, CAB's knobs from the command line, and the two runs."""

from __future__ import annotations

import json
from pathlib import Path

from ..validation import check_int, did_you_mean
from .checks import CLIError, existing_file, load_config, model_source, parse_device, writable


def _gguf_available() -> bool:
    """Whether the ``gguf`` package (transformers' GGUF reader) is installed."""
    import importlib.util

    return importlib.util.find_spec("gguf") is not None


def _causal_lm_source(args) -> tuple[str, dict, object]:
    """``--model`` (with ``--gguf-file``) checked: the model's path, the keyword arguments that load it, its config.

    The keywords are ``{"gguf_file": FILE}`` for a GGUF checkpoint (model, config and tokenizer all read it),
    else ``{}``. The config is loaded to check that the model is a causal LM before any weights load.
    """
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    gguf = {}
    if args.gguf_file is None:
        if str(args.model).endswith(".gguf") and Path(args.model).expanduser().is_file():
            raise CLIError(
                f"--model {args.model} is a GGUF file: pass its directory as --model and its name as --gguf-file"
            )
        source = model_source("--model", args.model)
    else:
        directory = Path(args.model).expanduser()
        if directory.is_dir() and not (directory / args.gguf_file).is_file():
            raise CLIError(f"--gguf-file {args.gguf_file}: no such file in the --model directory {args.model}")
        if not _gguf_available():
            raise CLIError(
                f"--gguf-file {args.gguf_file}: reading GGUF checkpoints needs the gguf package, which is not "
                "installed: pip install 'hf_icl[llm]'"
            )
        source = model_source("--model", args.model, needs=args.gguf_file)
        gguf = {"gguf_file": args.gguf_file}
    config = load_config("--model", args.model, source, **gguf)
    if type(config) not in MODEL_FOR_CAUSAL_LM_MAPPING:
        raise CLIError(
            f"--model {args.model} holds a {config.model_type!r} model ({type(config).__name__}), which is no causal "
            f"language model; hf-icl {args.command} needs one that AutoModelForCausalLM loads (e.g. GPT-2, Llama)"
        )
    return source, gguf, config


def _causal_lm_tokenizer(args, source: str, gguf: dict):
    """``--tokenizer`` if given, else the model's own (from its GGUF file when it has one); a fast tokenizer."""
    from ..data.niah import load_tokenizer

    if args.tokenizer is not None:
        return load_tokenizer(model_source("--tokenizer", args.tokenizer, needs=None))
    if gguf:
        from transformers import AutoTokenizer

        return load_tokenizer(AutoTokenizer.from_pretrained(source, **gguf))
    return load_tokenizer(source)


def _load_causal_lm(source: str, gguf: dict, dtype: str, device):
    """The model, in eval mode on ``device`` (None: cuda if available, else cpu), with SDPA attention."""
    import torch
    from transformers import AutoModelForCausalLM

    from ..modeling.model_folder import verify_model_folder

    device = device or torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if not gguf and Path(source).is_dir():  # a GGUF file is transformers' to parse; a folder is checked first
        verify_model_folder(source)
    model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, attn_implementation="sdpa", **gguf)
    return model.to(device).eval()


#: CAB hyperparameters with a flag of their own: CABParams field → flag (set on the model config when given)
_CAB_KNOBS = {
    "lam": "--lam",
    "sink_blocks": "--sink-blocks",
    "local_blocks": "--local-blocks",
    "magnitude_fraction": "--magnitude-fraction",
    "topk": "--topk",
    "score": "--score",
}


def _cab_knobs(args) -> dict:
    """The CAB knobs given on the command line, validated (the errors name the ``cab_*`` field)."""
    from ..attention.cab import CABParams

    knobs = {name: getattr(args, name) for name in _CAB_KNOBS if getattr(args, name) is not None}
    CABParams(**knobs)
    return knobs


def _set_cab_knobs(model, knobs: dict) -> None:
    """Store the knobs on the config as ``cab_*`` fields, as enable_cab does, so they survive and are recorded."""
    from ..attention.cab import config_field

    for name, value in knobs.items():
        setattr(model.config, config_field(name), value)


def _check_block_size(block_size: int) -> None:
    check_int("--block-size", block_size, low=16, high=128)
    if block_size & (block_size - 1):
        raise CLIError(f"--block-size must be a power of two in [16, 128], got {block_size}")


def _use_chat_template(choice: str, tokenizer) -> bool:
    """``--chat-template``: on, off, or auto (on when the tokenizer has a chat template)."""
    has_template = bool(getattr(tokenizer, "chat_template", None))
    if choice == "on" and not has_template:
        raise CLIError("--chat-template on: the tokenizer has no chat_template; use --chat-template off (or auto)")
    return has_template if choice == "auto" else choice == "on"


#: the longest default NIAH prompt (a longer one is a choice: --lengths)
LONGEST_DEFAULT_LENGTH = 4096
#: tokens kept free after the prompt for the answer
ANSWER_ROOM = 16


def default_niah_lengths(max_positions: int | None) -> list[int]:
    """A quarter, half and all of the longest power of two that leaves :data:`ANSWER_ROOM` tokens of the model's
    positions, at most :data:`LONGEST_DEFAULT_LENGTH`.

    >>> default_niah_lengths(8192), default_niah_lengths(1040), default_niah_lengths(None)
    ([1024, 2048, 4096], [256, 512, 1024], [1024, 2048, 4096])
    """
    room = LONGEST_DEFAULT_LENGTH if max_positions is None else min(max_positions - ANSWER_ROOM, LONGEST_DEFAULT_LENGTH)
    top = 1 << max(room, 1).bit_length() - 1
    return [top // 4, top // 2, top]


def run_niah_command(args) -> int:
    from ..data.niah import BUILTIN_HAYSTACKS, NeedleInAHaystackConfig
    from ..evaluation.niah import niah_methods, run_niah
    from ..evaluation.niah_report import write_niah_report

    methods = niah_methods(args.policies, args.sparsities, args.kept_blocks)  # every check runs before the model loads
    knobs = _cab_knobs(args)
    _check_block_size(args.block_size)
    for flag, value, variant in (("--keys", args.keys, "multikey"), ("--values", args.values, "multivalue")):
        if value is not None and args.variant != variant:
            raise CLIError(f"{flag} applies only to --variant {variant}, got --variant {args.variant}")
    if args.haystack not in BUILTIN_HAYSTACKS:
        existing_file("--haystack", args.haystack)
    writable("--output-dir", args.output_dir, directory=True)
    device = parse_device("--device", args.device)
    source, gguf, config = _causal_lm_source(args)
    tokenizer = _causal_lm_tokenizer(args, source, gguf)
    chat_template = _use_chat_template(args.chat_template, tokenizer)
    grid = {
        "context_lengths": args.lengths or default_niah_lengths(getattr(config, "max_position_embeddings", None)),
        "depths": args.depths,
        "samples_per_cell": args.samples,
        "haystack": args.haystack,
        "seed": args.seed,
        "variant": args.variant,
        "value_kind": args.value_kind,
    }
    if args.keys is not None:  # given only with their variant (checked above); absent: the config's default
        grid["n_keys"] = args.keys
    if args.values is not None:
        grid["n_values"] = args.values
    NeedleInAHaystackConfig(tokenizer=tokenizer, **grid)  # validates the grid (lengths, depths, ...)
    model = _load_causal_lm(source, gguf, args.dtype, device)
    _set_cab_knobs(model, knobs)
    out = Path(args.output_dir)
    records = run_niah(
        model,
        tokenizer,
        methods=methods,
        block_size=args.block_size,
        budget=args.budget,
        results_file=out / "results.jsonl",
        progress=not args.no_progress,
        preservation_queries=args.preservation_queries,
        chat_template=chat_template,
        gguf_file=args.gguf_file,
        answer_prefix=args.answer_prefix,
        **grid,
    )
    written = write_niah_report(records, out)
    print(written["summary.md"].read_text(encoding="utf-8"))
    print(f"results: {out / 'results.jsonl'} ({len(records)} records); report: {out}")
    return 0


def run_perplexity_command(args) -> int:
    from ..evaluation.cab_methods import niah_methods, other_cab_fields
    from ..evaluation.perplexity import long_text_perplexity, perplexity_markdown, text_digest, text_windows

    methods = niah_methods(args.policies, args.sparsities, args.kept_blocks)  # every check runs before the model loads
    knobs = _cab_knobs(args)
    _check_block_size(args.block_size)
    if not args.length:
        raise CLIError("--length must name at least one window length, e.g. 4096 or 4096,8192")
    if len(set(args.length)) < len(args.length):
        raise CLIError(f"--length must not repeat a length, got {','.join(map(str, args.length))}")
    texts = _perplexity_texts(args.text)
    writable("--output-dir", args.output_dir, directory=True)
    device = parse_device("--device", args.device)
    source, gguf, config = _causal_lm_source(args)
    tokenizer = _causal_lm_tokenizer(args, source, gguf)
    limit = getattr(config, "max_position_embeddings", None)
    for length in args.length:
        if isinstance(limit, int) and length > limit:
            raise CLIError(f"--length {length} is more than the model's max_position_embeddings={limit}")
    for name, text in texts.items():  # every text is long enough for the longest window: checked before weights load
        try:
            text_windows(tokenizer, text, max(args.length), args.windows)
        except ValueError as err:
            raise CLIError(f"--text {name}: {err}") from None
    model = _load_causal_lm(source, gguf, args.dtype, device)
    _set_cab_knobs(model, knobs)
    records, tables = [], []
    for name, text in texts.items():
        for length in args.length:
            found = long_text_perplexity(
                model,
                tokenizer,
                text,
                length=length,
                windows=args.windows,
                methods=methods,
                block_size=args.block_size,
                budget=args.budget,
                progress=not args.no_progress,
            )
            records += [{"text": name, **record} for record in found]
            tables.append(
                f"### {name} (sha256 {text_digest(text)[:12]}), windows of {length} tokens\n\n"
                + perplexity_markdown(found)
            )
    header = {
        "model": args.model,
        "gguf_file": args.gguf_file,
        "dtype": str(next(model.parameters()).dtype),
        "device": str(next(model.parameters()).device),
        "texts": [{"name": name, "sha256": text_digest(text), "characters": len(text)} for name, text in texts.items()],
        "lengths": list(args.length),
        "windows": args.windows,
        "block_size": args.block_size,
        "budget": args.budget,
        "cab": other_cab_fields(model.config),
    }
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({"header": header, "records": records}, indent=2) + "\n")
    report = "\n".join(tables)
    (out / "results.md").write_text(report, encoding="utf-8")
    print(report)
    print(f"results: {out / 'results.json'}, {out / 'results.md'}")
    return 0


def _perplexity_texts(spec: str | None) -> dict[str, str]:
    """``--text``: comma-separated built-in text names and UTF-8 file paths (a built-in name wins over a file of
    that name; write ``./NAME`` for the file); None: every built-in text. Returns ``{name or path: text}``."""

    from ..evaluation.perplexity import builtin_texts, load_builtin_text

    names = list(builtin_texts()) if spec is None else [item.strip() for item in spec.split(",") if item.strip()]
    if not names:
        raise CLIError(f"--text must name at least one built-in text ({', '.join(builtin_texts())}) or file")
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise CLIError(f"--text must not repeat a text, got {repeated[0]!r} twice")
    texts = {}
    for name in names:
        if name in builtin_texts():
            texts[name] = load_builtin_text(name)
            continue
        if not Path(name).expanduser().exists():
            hint = f" ({close})" if (close := did_you_mean(name, builtin_texts())) else ""
            raise CLIError(
                f"--text {name}: no such file, nor a built-in text{hint}; built-in texts: {', '.join(builtin_texts())}"
            )
        texts[name] = _read_text("--text", name)
    return texts


def _read_text(flag: str, path: str) -> str:
    """A UTF-8 text file's contents, with a missing, unreadable or binary file as one clear line."""
    target = existing_file(flag, path)
    try:
        return target.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise CLIError(f"{flag} {path}: not a UTF-8 text file") from None
