"""One run-cache format (run.json written last, tensors in safetensors): what is reused, what is trained again,
what is refused."""

import json
import os
import stat

import pytest
import torch

from hf_icl.training.run_cache import (
    RUN_FILE,
    RUN_FORMAT,
    TENSORS_FILE,
    DamagedRunError,
    read_run,
    write_run,
)


def test_a_run_reads_back_exactly_and_only_for_its_own_spec(tmp_path):
    losses = torch.linspace(0, 1, 7, dtype=torch.float64)
    errors = {"softmax": torch.randn(3, 5), "linear": torch.randn(3, 5)}
    spec = {"model": "linear_gpt", "seeds": [0, 1, 2], "steps": 40, "nested": {"lr": 1e-3}}
    write_run(tmp_path, spec, record={"seconds": 2.5, "curve": [[1, 0.5]]}, tensors={"losses": losses, **errors})
    run = read_run(tmp_path, spec)
    assert run.spec == spec and run.record == {"seconds": 2.5, "curve": [[1, 0.5]]}
    assert torch.equal(run.tensors["losses"], losses) and run.tensors["losses"].dtype == torch.float64
    assert all(torch.equal(run.tensors[k], v) for k, v in errors.items())
    assert read_run(tmp_path, {**spec, "steps": 41}) is None  # another spec: trained again
    assert read_run(tmp_path).spec == spec  # no spec asked: whatever finished there
    content = json.loads((tmp_path / RUN_FILE).read_text())
    assert content["format"] == RUN_FORMAT and content["tensors"] == ["linear", "losses", "softmax"]


def test_no_tensors_means_no_tensor_file_and_an_empty_folder_holds_no_run(tmp_path):
    assert read_run(tmp_path, {"a": 1}) is None
    write_run(tmp_path / "run", {"a": 1}, record={"seconds": 1})
    assert not (tmp_path / "run" / TENSORS_FILE).exists()
    assert read_run(tmp_path / "run", {"a": 1}).tensors == {}


@pytest.mark.parametrize(
    "old_cache",
    [
        {"spec.json": '{"a": 1}'},  # kernel-icl / gd-icl / stories before the one format
        {"run.json": '{"spec": {"a": 1}, "steps": 3}'},  # linear-attention before it (errors.safetensors beside)
    ],
)
def test_a_cache_of_an_older_format_is_trained_again_not_guessed_at(tmp_path, old_cache):
    for name, text in old_cache.items():
        (tmp_path / name).write_text(text)
    assert read_run(tmp_path, {"a": 1}) is None


def test_damaged_files_are_one_line_errors_naming_the_file_and_retrain(tmp_path):
    write_run(tmp_path, {"a": 1}, tensors={"losses": torch.ones(4)})
    (tmp_path / TENSORS_FILE).write_bytes((tmp_path / TENSORS_FILE).read_bytes()[:-3])
    with pytest.raises(DamagedRunError, match=r"tensors\.safetensors cannot be read .*--retrain") as err:
        read_run(tmp_path, {"a": 1})
    assert "\n" not in str(err.value)
    write_run(tmp_path, {"a": 1}, tensors={"losses": torch.ones(4)})
    content = json.loads((tmp_path / RUN_FILE).read_text())
    (tmp_path / RUN_FILE).write_text(json.dumps({**content, "tensors": ["losses", "errors"]}))
    with pytest.raises(DamagedRunError, match="lists"):
        read_run(tmp_path, {"a": 1})
    (tmp_path / RUN_FILE).write_text('{"format": ')
    with pytest.raises(DamagedRunError, match=r"run\.json cannot be read .*--retrain"):
        read_run(tmp_path, {"a": 1})


def test_run_json_is_written_last_and_whole_with_the_users_umask(tmp_path, monkeypatch):
    """A run whose tensors could not be written is not marked finished; the files are ordinary (umask) files."""
    import safetensors.torch

    def failing_save(*args, **kwargs):
        raise OSError("disk full")

    with monkeypatch.context() as patch:
        patch.setattr(safetensors.torch, "save_file", failing_save)
        with pytest.raises(OSError, match="disk full"):
            write_run(tmp_path, {"a": 1}, tensors={"losses": torch.ones(2)})
    assert not (tmp_path / RUN_FILE).exists() and read_run(tmp_path, {"a": 1}) is None
    old = os.umask(0o022)
    try:
        write_run(tmp_path, {"a": 1}, tensors={"losses": torch.ones(2)})
    finally:
        os.umask(old)
    for name in (RUN_FILE, TENSORS_FILE):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o644
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []
