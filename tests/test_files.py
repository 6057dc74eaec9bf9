"""hf_icl.files: what the package writes gets the user's umask, not a temporary file's private 0600."""

import os
import stat

from training_helpers import tiny_args

from hf_icl.files import apply_umask, umask_mode


def test_a_trained_run_and_its_checkpoints_are_written_with_the_umask(tmp_path):
    from hf_icl.training import train

    previous = os.umask(0o022)
    try:
        train(tiny_args(tmp_path / "run", max_steps=4, save_steps=2))
    finally:
        os.umask(previous)
    run = tmp_path / "run"
    written = [run / "metrics.json", run / "model.safetensors", run / "config.json"]
    written += list((run / "checkpoints" / "step-00000004").iterdir())
    modes = {path.name: stat.S_IMODE(path.stat().st_mode) for path in written if path.is_file()}
    assert modes and all(mode == 0o644 for mode in modes.values()), {k: oct(v) for k, v in modes.items()}


def test_apply_umask_follows_the_mask(tmp_path):
    path = tmp_path / "file"
    path.write_text("x")
    os.chmod(path, 0o600)
    previous = os.umask(0o027)
    try:
        assert umask_mode() == 0o640
        apply_umask(tmp_path)
    finally:
        os.umask(previous)
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
