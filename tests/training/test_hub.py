"""Pushing to the Hub without the network: a fake HfApi records what would be created and uploaded, and the
upload's allow/ignore patterns are resolved against a real training output directory."""

import huggingface_hub
import pytest
from huggingface_hub import RepoUrl, constants
from huggingface_hub.utils import filter_repo_objects
from training_helpers import tiny_args

from hf_icl.training import train
from hf_icl.training.hub import (
    HubAccessError,
    check_hub_access,
    default_repo_name,
    push_model_folder,
)

#: what a model repo must receive from a training run (the weights, config, card, plot, arguments)
MODEL_FILES = {
    "config.json",
    "model.safetensors",
    "README.md",
    "context_scaling.png",
    "training_args.json",
    "manifest.json",  # the sha256 of the model files (the checkpoints' manifests stay behind)
}


class FakeHfApi:
    """Records every call; ``whoami`` answers with ``identity`` or raises ``error``."""

    def __init__(self, identity=None, error=None, user="alice"):
        self.identity = identity or {"name": user, "orgs": [{"name": "icl-lab"}]}
        self.error = error
        self.user = user
        self.calls = []

    def whoami(self):
        self.calls.append(("whoami", {}))
        if self.error is not None:
            raise self.error
        return self.identity

    def create_repo(self, repo_id, **kwargs):
        self.calls.append(("create_repo", {"repo_id": repo_id, **kwargs}))
        full = repo_id if "/" in repo_id else f"{self.user}/{repo_id}"
        return RepoUrl(f"https://huggingface.co/{full}")

    def upload_folder(self, **kwargs):
        self.calls.append(("upload_folder", kwargs))
        return huggingface_hub.CommitInfo(
            commit_url=f"https://huggingface.co/{kwargs['repo_id']}/commit/0123abcd",
            commit_message=kwargs["commit_message"],
            commit_description="",
            oid="0123abcd",
        )


@pytest.fixture(autouse=True)
def online(monkeypatch):
    """Every test starts online with no saved token, whatever the machine's environment says."""
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr("hf_icl.training.hub.get_token", lambda: None)


@pytest.fixture(scope="module")
def trained_dir(tmp_path_factory):
    """A real training output directory (weights, card, plot, metrics, checkpoints) plus what a crashed or
    running training leaves: a lock, a half-written checkpoint, tracker logs, a stray optimizer state."""
    out = tmp_path_factory.mktemp("hub") / "linreg-run"
    train(tiny_args(out))
    (out / "train.lock").write_text('{"pid": 1}')
    (out / "checkpoints" / "step-00000015.tmp").mkdir()
    (out / "checkpoints" / "step-00000015.tmp" / "model.safetensors").write_bytes(b"partial")
    (out / "hf_icl").mkdir()
    (out / "hf_icl" / "events.out.tfevents.1.host").write_bytes(b"tb")
    (out / "optimizer.safetensors").write_bytes(b"state")
    (out / "rng_state_0.json").write_text("{}")
    (out / "notes.txt").write_text("my notes")
    return out


def uploaded_files(folder, call) -> set[str]:
    """The files ``upload_folder`` would send: the folder's files filtered by the call's patterns."""
    files = [p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()]
    kept = filter_repo_objects(files, allow_patterns=call["allow_patterns"], ignore_patterns=call["ignore_patterns"])
    return set(kept)


def test_push_uploads_the_model_and_nothing_of_the_run(trained_dir):
    api = FakeHfApi()
    url = push_model_folder(trained_dir, "icl-lab/linreg-run", private=True, commit_message="first model", api=api)
    assert url == "https://huggingface.co/icl-lab/linreg-run/commit/0123abcd"
    assert [name for name, _ in api.calls] == ["create_repo", "upload_folder"]
    create, upload = api.calls[0][1], api.calls[1][1]
    assert create == {"repo_id": "icl-lab/linreg-run", "exist_ok": True, "private": True, "repo_type": "model"}
    assert upload["repo_id"] == "icl-lab/linreg-run" and upload["commit_message"] == "first model"
    assert upload["folder_path"] == str(trained_dir)

    top_level = {p.name for p in trained_dir.iterdir() if p.is_file()}
    # metrics.json and the per-position CSV when this trainer writes them
    expected = MODEL_FILES | (top_level & {"metrics.json", "context_scaling.csv"})
    assert MODEL_FILES <= top_level
    assert uploaded_files(trained_dir, upload) == expected
    assert any((trained_dir / "checkpoints").rglob("optimizer.safetensors"))  # there, and not uploaded


def test_push_points_the_card_at_the_repo_and_names_the_model_in_its_message(trained_dir):
    api = FakeHfApi(user="bob")
    push_model_folder(trained_dir, "linreg-run", api=api)  # no namespace: the Hub puts it under the user
    create, upload = api.calls[0][1], api.calls[1][1]
    assert create["repo_id"] == "linreg-run" and create["private"] is False
    assert upload["repo_id"] == "bob/linreg-run"
    assert upload["commit_message"] == "Upload gpt2_icl trained with hf_icl"
    card = (trained_dir / "README.md").read_text()
    assert 'model_id = "bob/linreg-run"  #' in card
    assert card.count("model_id = ") == 1


def test_push_refuses_a_folder_without_its_model_or_card(tmp_path, trained_dir):
    api = FakeHfApi()
    for name in ("config.json", "model.safetensors", "README.md"):
        folder = tmp_path / f"without-{name}"
        folder.mkdir()
        for other in ("config.json", "model.safetensors", "README.md"):
            if other != name:
                (folder / other).write_bytes((trained_dir / other).read_bytes())
        with pytest.raises(ValueError, match=rf"folder '{folder}' lacks \['{name}'\]"):
            push_model_folder(folder, "icl-lab/x", api=api)
    with pytest.raises(ValueError, match="is not a directory"):
        push_model_folder(tmp_path / "missing", "icl-lab/x", api=api)
    assert api.calls == []


@pytest.mark.parametrize("variable", ["HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"])
def test_offline_mode_fails_before_anything_is_called(monkeypatch, trained_dir, variable):
    monkeypatch.setenv(variable, "1")
    api = FakeHfApi()
    with pytest.raises(HubAccessError, match=f"offline mode \\({variable}=1\\)"):
        check_hub_access("icl-lab/x", token="hf_token", api=api)
    with pytest.raises(HubAccessError, match="offline mode"):
        push_model_folder(trained_dir, "icl-lab/x", api=api)
    assert api.calls == []


def test_offline_mode_read_by_huggingface_hub_at_import_counts_too(monkeypatch):
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    api = FakeHfApi()
    with pytest.raises(HubAccessError, match="huggingface_hub.constants.HF_HUB_OFFLINE"):
        check_hub_access("icl-lab/x", token="hf_token", api=api)
    assert api.calls == []


def test_no_token_fails_before_anything_is_called():
    api = FakeHfApi()
    with pytest.raises(HubAccessError, match="not logged in") as raised:
        check_hub_access("icl-lab/x", api=api)
    assert "\n" not in str(raised.value)
    assert api.calls == []


def test_a_whoami_error_becomes_a_one_line_access_error():
    error = ConnectionError("HTTPSConnectionPool(host='hf.co'): Max retries exceeded\n  with url /api/whoami-v2")
    api = FakeHfApi(error=error)
    with pytest.raises(HubAccessError) as raised:
        check_hub_access("icl-lab/x", token="hf_token", api=api)
    message = str(raised.value)
    assert "\n" not in message and "ConnectionError" in message and "Max retries exceeded with url" in message
    assert "'icl-lab/x'" in message


def test_access_returns_the_user_for_their_own_or_their_orgs_namespace():
    assert check_hub_access("alice/x", token="hf_token", api=FakeHfApi()) == "alice"
    assert check_hub_access("icl-lab/x", token="hf_token", api=FakeHfApi()) == "alice"
    assert check_hub_access("x", token="hf_token", api=FakeHfApi()) == "alice"
    with pytest.raises(HubAccessError, match="not to 'someone-else'"):
        check_hub_access("someone-else/x", token="hf_token", api=FakeHfApi())


def test_the_default_api_asks_the_hub_with_the_saved_token(monkeypatch):
    """No api given: ``HfApi(token=...)`` is built with the token huggingface_hub finds, and asked ``whoami``."""
    monkeypatch.setattr("hf_icl.training.hub.get_token", lambda: "hf_saved")
    asked = []

    def whoami(self):
        asked.append(self.token)
        return {"name": "alice", "orgs": []}

    monkeypatch.setattr(huggingface_hub.HfApi, "whoami", whoami)
    assert check_hub_access("alice/linreg") == "alice"
    assert check_hub_access("alice/linreg", token="hf_given") == "alice"
    assert asked == ["hf_saved", "hf_given"]


@pytest.mark.parametrize("repo_id", ["datasets/a/b", "a--b", "bad name", "", ".hidden", 42])
def test_a_bad_repo_id_is_a_value_error_naming_it(monkeypatch, repo_id, trained_dir):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the repo id is checked first
    api = FakeHfApi()
    calls = (lambda: check_hub_access(repo_id, token="t", api=api), lambda: push_model_folder(trained_dir, repo_id))
    for call in calls:
        with pytest.raises(ValueError, match="repo_id") as raised:
            call()
        assert not isinstance(raised.value, HubAccessError)
        assert repr(repo_id) in str(raised.value)
    assert api.calls == []


def test_default_repo_name_is_the_output_folder_name(tmp_path):
    assert default_repo_name("outputs/linreg-gpt2") == "linreg-gpt2"
    assert default_repo_name(tmp_path / "run.v2" / ".." / "sgpt_run") == "sgpt_run"
    with pytest.raises(ValueError, match="folder name 'my run'.*; pass hub_model_id"):
        default_repo_name(tmp_path / "my run")


def test_a_network_failure_and_a_refused_token_are_told_apart(monkeypatch):
    """A DNS or connection failure is not "the Hub did not accept the token" (the token was never checked), and
    "not logged in" says when the Hub could not be reached either."""

    class ConnectError(Exception):  # httpx's transport error, by name
        pass

    class HfHubHTTPError(Exception):
        pass

    with pytest.raises(HubAccessError) as raised:
        check_hub_access("icl-lab/x", token="hf_token", api=FakeHfApi(error=ConnectError("Name or service not known")))
    assert "cannot be reached" in str(raised.value) and "did not accept" not in str(raised.value)
    refused = HfHubHTTPError("401 Client Error: Unauthorized for url: https://huggingface.co/api/whoami-v2")
    with pytest.raises(HubAccessError) as raised:
        check_hub_access("icl-lab/x", token="hf_token", api=FakeHfApi(error=refused))
    assert "did not accept the token" in str(raised.value) and "401" in str(raised.value)
    monkeypatch.setattr("hf_icl.training.hub.get_token", lambda: None)
    monkeypatch.setattr("hf_icl.training.hub.hub_unreachable", lambda timeout=3.0: "huggingface.co:443: no DNS")
    with pytest.raises(HubAccessError, match="not logged in.*cannot be reached from here \\(huggingface.co:443"):
        check_hub_access("icl-lab/x")


def test_the_reachability_probe_names_the_host_it_could_not_reach(monkeypatch):
    import socket

    from hf_icl.training import hub

    def refuse(address, timeout):
        raise OSError(f"[Errno -2] Name or service not known: {address[0]}")

    monkeypatch.undo()  # the real probe, with the socket call replaced
    monkeypatch.setattr(socket, "create_connection", refuse)
    assert hub.hub_unreachable().startswith("huggingface.co:443: [Errno -2] Name or service not known")
