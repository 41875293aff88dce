"""A local stand-in for the Hugging Face hub: the endpoints `ninfer fetch` uses, on 127.0.0.1.

* GET  /api/models/{repo}/revision/{rev}   -> {"id", "sha", "siblings": [{"rfilename"}]}
* HEAD /{repo}/resolve/{rev}/{file}        -> X-Repo-Commit, ETag, X-Linked-Etag (sha256), X-Linked-Size
* GET  /{repo}/resolve/{rev}/{file}        -> the bytes, honouring Range (206 + Content-Range)
Unknown revisions and files answer 404 with the X-Error-Code the hub uses. `drop_after` makes the next
GET of a file close the connection after that many bytes (once); `ranges` records each Range header.
"""

from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlparse


class HubState:
    def __init__(
        self, repo_id: str, commit: str, files: dict[str, bytes], branches: dict[str, str] | None = None
    ):
        self.repo_id, self.commit, self.files = repo_id, commit, files
        self.branches = branches or {"main": commit}
        self.drop_after: int | None = None
        self.ranges: list[str | None] = []
        self.lfs = True  # advertise the sha256 as the linked etag, as the hub does for LFS files

    def commit_for(self, rev: str) -> str | None:
        return rev if rev == self.commit else self.branches.get(rev)


def _handler(state: HubState):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _error(self, code: str, status: int = 404):
            self.send_response(status)
            self.send_header("X-Error-Code", code)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def _route(self):
            path = unquote(urlparse(self.path).path)
            api = f"/api/models/{state.repo_id}/revision/"
            if path.startswith(api):
                return "api", path[len(api) :], None
            prefix = f"/{state.repo_id}/resolve/"
            if path.startswith(prefix):
                rev, _, name = path[len(prefix) :].partition("/")
                return "resolve", rev, name
            return None, None, None

        def do_HEAD(self):
            self._serve(body=False)

        def do_GET(self):
            self._serve(body=True)

        def _serve(self, body: bool):
            kind, rev, name = self._route()
            if kind is None:
                return self._error("RepoNotFound")
            commit = state.commit_for(rev)
            if commit is None:
                return self._error("RevisionNotFound")
            if kind == "api":
                data = json.dumps(
                    {
                        "id": state.repo_id,
                        "sha": commit,
                        "siblings": [{"rfilename": f} for f in sorted(state.files)],
                    }
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if body:
                    self.wfile.write(data)
                return
            if name not in state.files:
                return self._error("EntryNotFound")
            data = state.files[name]
            sha = hashlib.sha256(data).hexdigest()
            start = 0
            rng = self.headers.get("Range")
            if body:
                state.ranges.append(rng)
            if rng:
                start = int(rng.split("=")[1].split("-")[0])
            self.send_response(206 if rng else 200)
            self.send_header("X-Repo-Commit", commit)
            self.send_header("ETag", f'"{sha if state.lfs else hashlib.sha1(data).hexdigest()}"')
            if state.lfs:
                self.send_header("X-Linked-Etag", f'"{sha}"')
                self.send_header("X-Linked-Size", str(len(data)))
            self.send_header("Accept-Ranges", "bytes")
            if rng:
                self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            self.send_header("Content-Length", str(len(data) - start))
            self.end_headers()
            if not body:
                return
            chunk = data[start:]
            if state.drop_after is not None:
                cut, state.drop_after = state.drop_after, None
                self.wfile.write(chunk[:cut])
                self.wfile.flush()
                self.close_connection = True
                return
            self.wfile.write(chunk)

    return Handler


class HubServer:
    def __init__(self, state: HubState):
        self.state = state
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> HubServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
