"""A stand-in for the Hub's network layer: ``huggingface_hub.HfApi``'s calls are replaced and recorded.

``install_fake_hub(monkeypatch)`` logs in with a fake token, turns
offline mode off, and records every whoami / create_repo / upload_folder call with the files an upload
would send (the folder filtered by the call's allow and ignore patterns, as huggingface_hub filters them).
"""

from pathlib import Path

import huggingface_hub


class FakeHub:
    """Stands in for huggingface_hub.HfApi's network calls and records them."""

    def __init__(self):
        self.calls = []

    def whoami(self, *args, **kwargs):
        self.calls.append(("whoami", kwargs))
        return {"name": "me", "orgs": []}

    def create_repo(self, repo_id, **kwargs):
        self.calls.append(("create_repo", {"repo_id": repo_id, **kwargs}))
        return huggingface_hub.RepoUrl(f"https://huggingface.co/{repo_id}")

    def upload_folder(self, **kwargs):
        folder = Path(kwargs["folder_path"])
        every = [str(path.relative_to(folder)) for path in folder.rglob("*") if path.is_file()]
        chosen = huggingface_hub.utils.filter_repo_objects(
            every, allow_patterns=kwargs["allow_patterns"], ignore_patterns=kwargs["ignore_patterns"]
        )
        files = sorted(chosen)
        self.calls.append(("upload_folder", {**kwargs, "files": files}))
        return huggingface_hub.CommitInfo(
            commit_url=f"https://huggingface.co/{kwargs['repo_id']}/commit/abc",
            commit_message=kwargs["commit_message"],
            commit_description="",
            oid="abc",
        )


def install_fake_hub(monkeypatch) -> FakeHub:
    hub = FakeHub()
    for name in ("whoami", "create_repo", "upload_folder"):
        monkeypatch.setattr(huggingface_hub.HfApi, name, lambda self, *a, _n=name, **k: getattr(hub, _n)(*a, **k))
    monkeypatch.setenv("HF_TOKEN", "hf_fake_token")
    for variable in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    return hub
