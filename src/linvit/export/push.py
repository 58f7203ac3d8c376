"""Uploading an export folder to the Hugging Face Hub (or any server speaking its HTTP API, named
by `endpoint`), through huggingface_hub; the token is huggingface_hub's own ($HF_TOKEN or
`hf auth login`)."""
from __future__ import annotations

import logging
from pathlib import Path

from linvit.errors import RunFailed

log = logging.getLogger("linvit")


def push_folder(folder: Path, repo_id: str, files: tuple, private: bool,
                endpoint: str | None) -> dict:
    """Create the model repository if needed and commit `files` of `folder` in one commit."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError

    api = HfApi(endpoint=endpoint)
    try:
        url = api.create_repo(repo_id, repo_type="model", private=private, exist_ok=True)
        commit = api.upload_folder(repo_id=repo_id, folder_path=str(folder),
                                   allow_patterns=list(files), repo_type="model",
                                   commit_message="linvit export")
    except (HfHubHTTPError, OSError) as e:
        raise RunFailed(f"push to {repo_id} failed: {e}") from None
    log.info("pushed %s to %s (commit %s)", ", ".join(files), url, commit.oid)
    return {"repo": repo_id, "url": str(url), "commit": commit.oid,
            "endpoint": api.endpoint}
