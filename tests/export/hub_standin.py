"""A local stand-in for the part of the Hugging Face Hub's HTTP API that an upload and a download
use, so that `linvit export push_to_hub=...` and timm's `hf-hub:` loader run in tests without the
network. It keeps each repository's files in memory, as the last commit left them.

Served: repository creation, the model card's metadata check, the pre-upload check (every file
answered "regular", so contents come base64 in the commit instead of through LFS), the NDJSON
commit, and `resolve` (HEAD and GET) for downloads. Anything else is answered 404 and listed in
`unhandled`, so a test sees what a new huggingface_hub asks for.
"""
from __future__ import annotations

import base64
import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def card_metadata_errors(card: str) -> list[str]:
    """What the Hub would refuse in a model card's YAML front matter (a mapping between `---`
    lines); the stand-in's whole check."""
    import yaml

    if not card.startswith("---\n"):
        return ["no YAML metadata block at the top of README.md"]
    block = card[4:].split("\n---\n", 1)
    if len(block) < 2:
        return ["the metadata block is not closed by a --- line"]
    try:
        meta = yaml.safe_load(block[0])
    except yaml.YAMLError as e:
        return [f"invalid YAML: {e}"]
    return [] if isinstance(meta, dict) else ["the metadata is not a mapping"]


class HubStandIn:
    def __init__(self):
        self.repos: dict[str, dict[str, bytes]] = {}
        self.commits: dict[str, str] = {}
        self.created: list[dict] = []
        self.unhandled: list[str] = []
        self.refuse_commits = False          # answer every commit 403, as a Hub without rights
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.endpoint = f"http://127.0.0.1:{self.server.server_port}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> HubStandIn:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _commit(self, repo: str, body: bytes) -> dict:
        files = self.repos.setdefault(repo, {})
        for line in body.decode().splitlines():
            entry = json.loads(line)
            if entry["key"] == "file":
                value = entry["value"]
                files[value["path"]] = base64.b64decode(value["content"])
        oid = hashlib.sha1(json.dumps(sorted((k, hashlib.sha256(v).hexdigest())
                                             for k, v in files.items())).encode()).hexdigest()
        self.commits[repo] = oid
        return {"commitUrl": f"{self.endpoint}/{repo}/commit/{oid}", "commitOid": oid}

    def _handler(self):
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):       # quiet: pytest shows failures, not traffic
                pass

            def _reply(self, status: int, payload=None, headers: dict | None = None,
                       body: bytes | None = None):
                data = body if body is not None else json.dumps(payload or {}).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            def _body(self) -> bytes:
                return self.rfile.read(int(self.headers.get("Content-Length", 0)))

            def do_POST(self):
                parts = self.path.split("?")[0].strip("/").split("/")
                body = self._body()
                if parts[:3] == ["api", "repos", "create"]:
                    request = json.loads(body)
                    hub.created.append(request)
                    repo = f"{request['organization']}/{request['name']}" \
                        if request.get("organization") else request["name"]
                    hub.repos.setdefault(repo, {})
                    return self._reply(200, {"url": f"{hub.endpoint}/{repo}", "name": repo})
                if parts[:2] == ["api", "validate-yaml"]:
                    errors = card_metadata_errors(json.loads(body)["content"])
                    return self._reply(400 if errors else 200,
                                       {"errors": [{"message": e} for e in errors],
                                        "warnings": []})
                if parts[:2] == ["api", "models"] and parts[4:5] == ["preupload"]:
                    files = json.loads(body)["files"]
                    return self._reply(200, {"files": [
                        {"path": f["path"], "uploadMode": "regular", "shouldIgnore": False}
                        for f in files]})
                if parts[:2] == ["api", "models"] and parts[4:5] == ["commit"]:
                    if hub.refuse_commits:
                        return self._reply(403, {"error": "You have no write access"})
                    return self._reply(200, hub._commit("/".join(parts[2:4]), body))
                hub.unhandled.append(f"POST {self.path}")
                return self._reply(404, {"error": "not served by the stand-in"})

            def _resolve(self):
                parts = self.path.split("?")[0].strip("/").split("/")
                repo = "/".join(parts[:2])
                if parts[2:3] == ["resolve"] and repo in hub.repos:
                    name = "/".join(parts[4:])
                    data = hub.repos[repo].get(name)
                    if data is None:
                        return self._reply(404, {"error": "no such file"},
                                           {"X-Error-Code": "EntryNotFound"})
                    etag = hashlib.sha256(data).hexdigest()
                    return self._reply(200, body=data, headers={
                        "ETag": f'"{etag}"', "X-Repo-Commit": hub.commits[repo]})
                hub.unhandled.append(f"{self.command} {self.path}")
                return self._reply(404, {"error": "not served by the stand-in"},
                                   {"X-Error-Code": "RepoNotFound"})

            do_GET = do_HEAD = _resolve

        return Handler
