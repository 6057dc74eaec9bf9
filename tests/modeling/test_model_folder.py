"""Model folders are verified before they are used (issue 30): the manifest where there is one, the safetensors
headers (parsed by hf_icl, not by safetensors), config against weights key by key and shape by shape, finite
weights. Each damaged folder is refused by ``AutoModel.from_pretrained`` (a ``ModelFolderError`` naming the file and
what is wrong) and by ``hf-icl evaluate`` / ``hf-icl push`` (exit 2, one line, before any task or estimator is
built); before this check every one of them evaluated with exit 0 or ended in a raw safetensors / torch error.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import struct
from pathlib import Path

import pytest
import torch
from repo_paths import REPO
from training_helpers import tiny_args
from transformers import AutoModel, AutoModelForCausalLM

import hf_icl  # noqa: F401  (registers the models)
from hf_icl import GPT2ForInContextRegression, GPT2ICLConfig
from hf_icl.cli import main
from hf_icl.modeling import (
    MODEL_CLASSES,
    GDLanguageModelConfig,
    GDTransformerForCausalLM,
    LinearGPTConfig,
    LinearGPTForCausalLM,
)
from hf_icl.modeling.model_folder import ModelFolderError, verify_model_folder, write_model_manifest
from hf_icl.training import train
from hf_icl.training.checkpoints import latest_checkpoint
from hf_icl.training.manifest import CheckpointError

ZOO = REPO / "models"

N_DIMS, N_POINTS = 3, 8


def gpt2(n_layer: int = 1, n_embd: int = 16, seed: int = 0) -> GPT2ForInContextRegression:
    torch.manual_seed(seed)
    config = GPT2ICLConfig(n_dims=N_DIMS, n_points=N_POINTS, n_embd=n_embd, n_layer=n_layer, n_head=2)
    return GPT2ForInContextRegression(config).eval()


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """Pristine folders, copied by each test before it damages them: a saved 1-layer and 2-layer GPT2ICL (no
    manifest), the 1-layer one with a final-folder manifest, and a real training run (final folder + checkpoint)."""
    root = tmp_path_factory.mktemp("folders")
    gpt2(1).save_pretrained(root / "one")
    gpt2(2).save_pretrained(root / "two")
    shutil.copytree(root / "one", root / "final")
    write_model_manifest(root / "final")
    train(tiny_args(root / "run"))
    return root


@pytest.fixture
def folder(store, tmp_path):
    def copy(name: str) -> Path:
        target = tmp_path / name
        shutil.copytree(store / name, target)
        return target

    return copy


# -- how the rows damage a folder ---------------------------------------------------------------------------------
def header_of(path: Path) -> tuple[dict, bytes]:
    raw = path.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8 : 8 + length]), raw[8 + length :]


def write_raw(path: Path, header_bytes: bytes, data: bytes, length: int | None = None) -> None:
    length = len(header_bytes) if length is None else length
    path.write_bytes(struct.pack("<Q", length) + header_bytes + data)


def edit_header(edit):
    def damage(root: Path) -> None:
        path = root / "model.safetensors"
        header, data = header_of(path)
        write_raw(path, edit(header), data)

    return damage


def zero_256_bytes(root: Path) -> None:
    path = root / "model.safetensors"
    raw = bytearray(path.read_bytes())
    raw[-300:-44] = bytes(256)  # inside the data, the header untouched
    path.write_bytes(bytes(raw))


def nan_in(key: str):
    def damage(root: Path) -> None:
        path = root / "model.safetensors"
        header, data = header_of(path)
        begin, _ = header[key]["data_offsets"]
        data = bytearray(data)
        data[begin : begin + 4] = struct.pack("<f", float("nan"))
        write_raw(path, json.dumps(header).encode(), bytes(data))

    return damage


def set_config(**fields):
    def damage(root: Path) -> None:
        config = json.loads((root / "config.json").read_text())
        (root / "config.json").write_text(json.dumps({**config, **fields}))

    return damage


def truncate(root: Path) -> None:
    path = root / "model.safetensors"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def offsets_out_of_range(header: dict) -> bytes:
    key = "head.read_out.bias"
    begin, end = header[key]["data_offsets"]
    header[key]["data_offsets"] = [begin + 10**6, end + 10**6]
    return json.dumps(header).encode()


def unknown_dtype(header: dict) -> bytes:
    header["head.read_out.bias"]["dtype"] = "F128"
    return json.dumps(header).encode()


def length_beyond_file(root: Path) -> None:
    path = root / "model.safetensors"
    header, data = header_of(path)
    write_raw(path, json.dumps(header).encode(), data, length=10**9)


BIAS = "head.read_out.bias"
#: (id, pristine folder, damage, words the Python error and the CLI line must both hold)
DAMAGED = [
    ("zeroed-bytes-final-folder", "final", zero_256_bytes, ["model.safetensors", "corrupted", "sha256", "manifest"]),
    ("listed-file-missing", "run", lambda r: (r / "training_args.json").unlink(), ["training_args.json", "missing"]),
    ("weights-missing", "final", lambda r: (r / "model.safetensors").unlink(), ["model.safetensors", "manifest.json"]),
    (
        "config-one-layer-fewer",
        "two",
        set_config(n_layer=1),
        ["model.safetensors", "config.json", "model.backbone.h.1"],
    ),
    ("config-one-layer-more", "one", set_config(n_layer=2), ["lacks", "config.json", "model.backbone.h.1"]),
    ("config-other-width", "one", set_config(n_embd=32), ["shape", "config.json", "[16] vs [32]"]),
    ("nan-weight", "one", nan_in(BIAS), ["model.safetensors", BIAS, "non-finite"]),
    ("truncated", "one", truncate, ["model.safetensors", "truncated"]),
    ("header-length-beyond-file", "one", length_beyond_file, ["model.safetensors", "header length", "1000000000"]),
    (
        "header-not-json",
        "one",
        edit_header(lambda h: b"{not json" + b" " * 20),
        ["model.safetensors", "not valid JSON"],
    ),
    ("header-a-list", "one", edit_header(lambda h: b"[1, 2, 3]"), ["model.safetensors", "list", "not an object"]),
    ("offsets-out-of-range", "one", edit_header(offsets_out_of_range), ["model.safetensors", BIAS, "data_offsets"]),
    ("dtype-unknown", "one", edit_header(unknown_dtype), ["model.safetensors", BIAS, "'F128'"]),
]


@pytest.mark.parametrize(("name", "damage", "words"), [pytest.param(*r[1:], id=r[0]) for r in DAMAGED])
def test_from_pretrained_refuses_a_damaged_folder(name, damage, words, folder):
    root = folder(name)
    damage(root)
    with pytest.raises(ModelFolderError) as caught:
        AutoModel.from_pretrained(root)
    message = str(caught.value)
    assert "\n" not in message and str(root) in message
    for word in words:
        assert word in message, (word, message)
    assert isinstance(caught.value, CheckpointError) and isinstance(caught.value, ValueError)


def forbid_work(monkeypatch) -> None:
    """Verification comes before the model is loaded, any evaluation runs or the Hub is asked: reaching one of them
    fails the test (the argument checks, the task family and the estimators, all cheap, come first)."""
    import hf_icl.evaluation
    import hf_icl.evaluation.garg_suite

    def refuse(*args, **kwargs):
        raise AssertionError("work started before the model folder was verified")

    monkeypatch.setattr(AutoModel, "from_pretrained", refuse)
    monkeypatch.setattr(hf_icl.evaluation, "evaluate_context_scaling", refuse)
    monkeypatch.setattr(hf_icl.evaluation.garg_suite, "run_garg_suite", refuse)
    monkeypatch.setattr("hf_icl.training.hub.check_hub_access", refuse)


@pytest.fixture
def no_work(monkeypatch):
    forbid_work(monkeypatch)


@pytest.mark.parametrize(("name", "damage", "words"), [pytest.param(*r[1:], id=r[0]) for r in DAMAGED])
def test_evaluate_refuses_a_damaged_folder_in_one_line(name, damage, words, folder, tmp_path, capsys, no_work):
    root = folder(name)
    damage(root)
    argv = ["evaluate", "--model", str(root), "--task", "linear_regression", "--n-prompts", "4"]
    assert main([*argv, "--output-dir", str(tmp_path / "eval")]) == 2
    captured = capsys.readouterr()
    (line,) = captured.err.strip().splitlines()
    assert line.startswith("hf-icl evaluate: error: model folder ") and captured.out == ""
    for word in words:
        assert word in line, (word, line)
    assert not (tmp_path / "eval" / "metrics.json").exists()


def test_evaluate_suite_verifies_first(folder, tmp_path, capsys, no_work):
    root = folder("one")
    nan_in(BIAS)(root)
    argv = ["evaluate", "--model", str(root), "--task", "linear_regression", "--suite", "garg", "--n-prompts", "4"]
    assert main([*argv, "--output-dir", str(tmp_path / "eval")]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "model.safetensors" in line and BIAS in line and "non-finite" in line


def test_a_damaged_checkpoint_folder_is_refused_by_its_own_manifest(folder, capsys, tmp_path, monkeypatch):
    run = folder("run")
    checkpoint = latest_checkpoint(run)
    zero_256_bytes(checkpoint)
    with pytest.raises(ModelFolderError, match=r"file model\.safetensors is corrupted"):
        AutoModel.from_pretrained(checkpoint)
    forbid_work(monkeypatch)
    argv = ["evaluate", "--model", str(checkpoint), "--task", "linear_regression", "--n-prompts", "4"]
    assert main([*argv, "--output-dir", str(tmp_path / "eval")]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "model.safetensors" in line and "corrupted" in line


def test_every_file_a_checkpoint_manifest_lists_is_checked(folder):
    checkpoint = latest_checkpoint(folder("run"))
    AutoModel.from_pretrained(checkpoint)  # intact: loads
    (checkpoint / "optimizer.json").write_text("{}")
    with pytest.raises(ModelFolderError, match=r"file optimizer\.json has \d+ bytes, manifest\.json says"):
        AutoModel.from_pretrained(checkpoint)


def test_push_refuses_a_damaged_folder_before_asking_the_hub(folder, capsys, no_work):
    run = folder("run")
    zero_256_bytes(run)
    assert main(["push", str(run), "icl-lab/x"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("hf-icl push: error: model folder ") and "model.safetensors is corrupted" in line


@pytest.mark.parametrize("command", ["niah", "perplexity"])
def test_language_model_commands_verify_a_plain_transformers_folder(command, tmp_path, capsys, monkeypatch):
    """``hf-icl niah`` / ``perplexity`` load any causal LM folder: a config with a layer fewer than the weights is
    refused before transformers loads it (and drops the layer with a log line)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    root = tmp_path / "lm"
    torch.manual_seed(0)
    tiny = GPT2Config(n_layer=2, n_embd=16, n_head=2, vocab_size=32, n_positions=128, bos_token_id=0, eos_token_id=0)
    GPT2LMHeadModel(tiny).save_pretrained(root)
    config = json.loads((root / "config.json").read_text())
    (root / "config.json").write_text(json.dumps({**config, "n_layer": 1}))
    capsys.readouterr()  # the save's progress bar

    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded before its folder was verified")

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", refuse)
    extra = ["--length", "32"] if command == "perplexity" else ["--lengths", "64"]
    argv = [command, "--model", str(root), "--tokenizer", str(ZOO / "niah-retriever"), *extra]
    assert main([*argv, "--output-dir", str(tmp_path / "out")]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"hf-icl {command}: error: model folder ") and "transformer.h.1." in line, line


# -- good paths ---------------------------------------------------------------------------------------------------
def test_the_trainer_writes_a_manifest_of_the_model_files(store):
    run = store / "run"
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["format"] == "hf_icl-model" and manifest["format_version"] == 1
    listed = {"config.json", "model.safetensors", "training_args.json"}
    assert manifest["files"] == {n: {"sha256": sha256(run / n), "bytes": (run / n).stat().st_size} for n in listed}
    # the card, plots and metrics are not model files: rewriting them keeps the folder valid
    verify_model_folder(run)
    # a checkpoint keeps its own format, so old checkpoints still resume
    checkpoint = json.loads((latest_checkpoint(run) / "manifest.json").read_text())
    assert checkpoint["format"] == "hf_icl-checkpoint" and checkpoint["format_version"] == 1


def test_a_clean_folder_loads_bit_exactly(store):
    model = gpt2(1)
    reloaded = AutoModel.from_pretrained(store / "final")
    for key, tensor in model.state_dict().items():
        assert torch.equal(reloaded.state_dict()[key], tensor), key
    xs = torch.randn(4, N_POINTS, N_DIMS, generator=torch.Generator().manual_seed(1))
    ys = torch.randn(4, N_POINTS, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert torch.equal(model(xs, ys).predictions, reloaded(xs, ys).predictions)


def test_verify_false_skips_the_check(folder):
    root = folder("one")
    nan_in(BIAS)(root)
    with pytest.raises(ModelFolderError):
        AutoModel.from_pretrained(root)
    model = AutoModel.from_pretrained(root, verify=False)
    assert torch.isnan(model.state_dict()[BIAS]).any()
    with pytest.raises(ValueError, match="verify must be True or False, got 'no'"):
        GPT2ForInContextRegression.from_pretrained(root, verify="no")


def test_a_stale_manifest_is_named(folder):
    root = folder("final")
    gpt2(1, seed=5).save_pretrained(root)  # new weights, the old manifest
    with pytest.raises(ModelFolderError, match="model.safetensors .*manifest.json"):
        AutoModel.from_pretrained(root)
    write_model_manifest(root)
    AutoModel.from_pretrained(root)


def test_a_base_model_loads_from_a_head_folder(store):
    from hf_icl import GPT2ICLModel

    base = GPT2ICLModel.from_pretrained(store / "final")
    assert torch.equal(
        base.state_dict()["backbone.h.0.ln_1.weight"], gpt2(1).state_dict()["model.backbone.h.0.ln_1.weight"]
    )


def test_sharded_weights_are_listed_and_checked(tmp_path):
    model = gpt2(2)
    model.save_pretrained(tmp_path, max_shard_size="20KB")
    shards = sorted(p.name for p in tmp_path.glob("model-*.safetensors"))
    assert len(shards) >= 2 and (tmp_path / "model.safetensors.index.json").is_file()
    manifest = write_model_manifest(tmp_path)
    assert set(manifest["files"]) == {"config.json", "model.safetensors.index.json", *shards}
    reloaded = AutoModel.from_pretrained(tmp_path)
    assert all(torch.equal(reloaded.state_dict()[k], v) for k, v in model.state_dict().items())
    (tmp_path / "manifest.json").unlink()
    path = tmp_path / shards[-1]
    header, data = header_of(path)
    key = min(k for k in header if k != "__metadata__")
    assert header[key]["dtype"] == "F32"
    begin = header[key]["data_offsets"][0]
    data = bytearray(data)
    data[begin : begin + 4] = struct.pack("<f", float("inf"))
    write_raw(path, json.dumps(header).encode(), bytes(data))
    with pytest.raises(ModelFolderError, match=rf"{shards[-1]}: the weight '{key}' holds 1 non-finite value "):
        AutoModel.from_pretrained(tmp_path)
    # a shard the index names but that is gone
    path.unlink()
    with pytest.raises(ModelFolderError, match=rf"model\.safetensors\.index\.json maps .* to the shard {shards[-1]}"):
        AutoModel.from_pretrained(tmp_path)


def every_model():
    for config_class, model_class in MODEL_CLASSES.values():
        config = config_class.from_preset("tiny") if hasattr(config_class, "from_preset") else config_class()
        yield pytest.param(config, model_class, AutoModel, id=model_class.__name__)
    yield pytest.param(GDLanguageModelConfig(), GDTransformerForCausalLM, AutoModelForCausalLM, id="gd-lm")
    yield pytest.param(LinearGPTConfig(), LinearGPTForCausalLM, AutoModelForCausalLM, id="linear-gpt-lm")


@pytest.mark.parametrize(("config", "model_class", "auto"), list(every_model()))
def test_every_hf_icl_model_verifies_and_round_trips(config, model_class, auto, tmp_path):
    torch.manual_seed(0)
    model = model_class(config)
    model.save_pretrained(tmp_path)
    write_model_manifest(tmp_path)
    reloaded = auto.from_pretrained(tmp_path)
    assert type(reloaded) is model_class
    for key, tensor in model.state_dict().items():
        assert torch.equal(reloaded.state_dict()[key], tensor), key
    # and a config that disagrees with the weights is caught for this architecture too
    config_json = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "manifest.json").unlink()
    width_field = next(f for f in ("n_embd", "embed_dim", "hidden_size", "n_dims") if f in config_json)
    (tmp_path / "config.json").write_text(json.dumps({**config_json, width_field: config_json[width_field] * 2}))
    with pytest.raises(
        ModelFolderError, match=r"config\.json and model\.safetensors disagree: \d+ weights have another shape"
    ):
        auto.from_pretrained(tmp_path)


def test_write_model_manifest_refuses_a_folder_without_a_model(tmp_path):
    with pytest.raises(ModelFolderError, match="config.json is missing"):
        write_model_manifest(tmp_path)
    gpt2(1).save_pretrained(tmp_path)
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(ModelFolderError, match="holds neither model.safetensors nor model.safetensors.index.json"):
        write_model_manifest(tmp_path)
