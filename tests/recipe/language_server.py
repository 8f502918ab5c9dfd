"""A client of the YAML language server (the npm package ``yaml-language-server``) over LSP on standard input
and output: it opens documents and returns the diagnostics the server publishes for each, as an editor shows them.

The server runs with the JSON Schema Store off (it would fetch https://www.schemastore.org/api/json/catalog.json);
each document's schema comes from its first line, ``# yaml-language-server: $schema=...``, resolved against the
document's URI, as in an editor.
"""

from __future__ import annotations

import json
import queue
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Any

SETTINGS = {"yaml": {"validate": True, "schemaStore": {"enable": False}, "schemas": {}, "hover": False,
                     "completion": False, "format": {"enable": False}}}


class LanguageServer:
    """One ``yaml-language-server --stdio`` process; :meth:`diagnostics` opens documents and waits for their diagnostics."""

    def __init__(self, command: list[str], root: Path, timeout: float = 60.0):
        self.timeout = timeout
        self._stderr = tempfile.TemporaryFile()  # not a pipe: a server that logs much would block on a full one
        self._process = subprocess.Popen(command, cwd=root, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=self._stderr)
        self._messages: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._next_id = 0
        self._published: dict[str, list[dict[str, Any]]] = {}
        threading.Thread(target=self._read, daemon=True).start()
        self._request("initialize", {
            "processId": None, "rootUri": root.as_uri(), "workspaceFolders": [{"uri": root.as_uri(), "name": root.name}],
            "capabilities": {"textDocument": {"publishDiagnostics": {}}, "workspace": {"configuration": True}},
        })
        self._notify("initialized", {})
        self._notify("workspace/didChangeConfiguration", {"settings": SETTINGS})

    def diagnostics(self, documents: dict[str, str]) -> dict[str, list[dict[str, Any]]]:
        """The diagnostics of each document (URI -> text), opened together."""
        for uri, text in documents.items():
            self._notify("textDocument/didOpen", {"textDocument": {"uri": uri, "languageId": "yaml", "version": 1, "text": text}})
        while not set(documents) <= set(self._published):
            self._handle(self._receive())
        found = {uri: self._published.pop(uri) for uri in documents}
        for uri in documents:
            self._notify("textDocument/didClose", {"textDocument": {"uri": uri}})
        return found

    def close(self) -> None:
        try:
            self._request("shutdown", None)
            self._notify("exit", None)
            self._process.wait(timeout=10)
        except (OSError, RuntimeError, TimeoutError, subprocess.TimeoutExpired):
            self._process.kill()
            self._process.wait()
        self._stderr.close()

    # -- JSON-RPC over standard input and output ------------------------------------------------------------

    def _send(self, message: dict[str, Any]) -> None:
        body = json.dumps({"jsonrpc": "2.0", **message}).encode()
        assert self._process.stdin is not None
        self._process.stdin.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)
        self._process.stdin.flush()

    def _notify(self, method: str, params: Any) -> None:
        self._send({"method": method, "params": params})

    def _request(self, method: str, params: Any) -> Any:
        self._next_id += 1
        self._send({"id": self._next_id, "method": method, "params": params})
        while True:
            message = self._receive()
            if message.get("id") == self._next_id and "method" not in message:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result")
            self._handle(message)

    def _receive(self) -> dict[str, Any]:
        try:
            message = self._messages.get(timeout=self.timeout)
        except queue.Empty:
            raise TimeoutError(f"no message from the language server in {self.timeout:.0f} s") from None
        if message is None:
            self._process.wait(timeout=10)
            self._stderr.seek(0)
            raise RuntimeError(f"the language server exited: {self._stderr.read().decode(errors='replace')[-3000:]}")
        return message

    def _handle(self, message: dict[str, Any]) -> None:
        method = message.get("method")
        if method == "textDocument/publishDiagnostics":
            self._published[message["params"]["uri"]] = message["params"]["diagnostics"]
        elif method == "workspace/configuration":  # the server asks for its settings, one item per section
            self._send({"id": message["id"], "result": [SETTINGS.get(item.get("section", ""), SETTINGS["yaml"])
                                                        for item in message["params"]["items"]]})
        elif "id" in message and method is not None:  # any other request of the server's: registrations, progress
            self._send({"id": message["id"], "result": None})

    def _read(self) -> None:
        stream = self._process.stdout
        assert stream is not None
        while True:
            length = None
            while (line := stream.readline()) not in (b"\r\n", b""):
                name, _, value = line.decode().partition(":")
                if name.lower() == "content-length":
                    length = int(value)
            if not line or length is None:
                self._messages.put(None)
                return
            self._messages.put(json.loads(stream.read(length)))
