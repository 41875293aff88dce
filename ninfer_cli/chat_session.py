"""`ninfer chat`'s conversation: the system message, the turns, the pictures waiting for the next message,
and the REPL commands that change them (/system, /undo, /retry, /compact, /save, /load; /reset and /image in
chat.py).

Saved conversations are OpenAI chat messages in a JSON array (the system message first, pictures as
`image_url` data URLs), so a file can also be sent to any OpenAI-compatible server, or written by hand and
loaded; a file that is not such an array is refused in one line and the conversation is left as it was.
"""

from __future__ import annotations

import base64
import binascii
import json
from pathlib import Path
from typing import Any

from engine.compaction import INSTRUCTION, summary_text
from engine.errors import NinferError
from ninfer_cli.chat_backends import data_url_part

COMMANDS = ("/system", "/undo", "/save", "/load")


def user_content(text: str, pictures: list[bytes]):
    """A user message's content: the text, or the pictures first and then the text."""
    if not pictures:
        return text
    return [*({"type": "image", "data": data} for data in pictures), {"type": "text", "text": text}]


class Conversation:
    def __init__(self, system: str | None):
        self.system = system or None
        self.turns: list[dict[str, Any]] = []
        self.pending: list[bytes] = []  # attached with /image, for the next message

    def messages(self) -> list[dict[str, Any]]:
        """What the model is sent: the system message, then the turns (every turn resends its pictures)."""
        return ([{"role": "system", "content": self.system}] if self.system else []) + self.turns

    def ask(self, text: str) -> None:
        self.turns.append({"role": "user", "content": user_content(text, self.pending)})

    def answered(self, reply: str) -> None:
        self.turns.append({"role": "assistant", "content": reply})
        self.pending = []

    def unask(self) -> None:
        """The last message taken back (its reply failed); its pictures stay attached."""
        self.turns.pop()

    def clear(self) -> None:
        self.turns, self.pending = [], []

    def retry(self) -> dict[str, Any]:
        """The last reply taken back, to be asked again (returned, so a failed retry can put it back)."""
        if not self.turns or self.turns[-1]["role"] != "assistant":
            raise NinferError("there is no reply to retry yet; type a message")
        return self.turns.pop()

    def compact_request(self) -> list[dict[str, Any]]:
        """What the model is sent to summarise the conversation (for /compact)."""
        if not self.turns:
            raise NinferError("there is nothing to compact yet; type a message")
        return [*self.messages(), {"role": "user", "content": INSTRUCTION}]

    def compacted(self, summary: str) -> str:
        """The turns replaced by the model's summary of them (the system message and attached pictures
        stay); what it did, in a line."""
        summary = summary.rpartition("</think>")[2]  # a thinking model's reasoning is not the summary
        if not summary.strip():
            raise NinferError("the model wrote no summary; the conversation is left as it was")
        count = len(self.turns)
        self.turns = [{"role": "user", "content": summary_text(summary.strip())}]
        return f"the conversation is compacted: {count} turns into the summary above"

    def put_back(self, reply: dict[str, Any]) -> None:
        """A reply taken by `retry` restored (asking again failed)."""
        self.turns.append(reply)

    def command(self, word: str, arg: str) -> str:
        """Run one of COMMANDS; what it did, in a line."""
        if word == "/system":
            if not arg:
                return (
                    f"system message: {self.system!r}"
                    if self.system
                    else "no system message (/system TEXT sets one)"
                )
            self.system = arg
            return "system message set (it applies from the next reply on)"
        if word == "/undo":
            if len(self.turns) < 2:
                raise NinferError("nothing to undo yet")
            del self.turns[-2:]
            return "the last exchange is undone"
        if not arg:
            raise NinferError(f"{word} takes a file: {word} PATH")
        path = Path(arg).expanduser()
        if word == "/save":
            return self._save(path)
        return self._load(path)

    def _save(self, path: Path) -> str:
        def part(p: dict[str, Any]) -> dict[str, Any]:
            return data_url_part(p["data"]) if p["type"] == "image" else p

        messages = [
            {**m, "content": [part(p) for p in m["content"]]} if isinstance(m["content"], list) else m
            for m in self.messages()
        ]
        try:
            path.write_text(json.dumps(messages, ensure_ascii=False, indent=1) + "\n")
        except OSError as e:
            raise NinferError(f"cannot write {path}: {e.strerror}") from e
        return f"saved {len(self.turns)} messages to {path}"

    def _load(self, path: Path) -> str:
        try:
            value = json.loads(path.read_text())
        except OSError as e:
            raise NinferError(f"cannot read {path}: {e.strerror}") from e
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise NinferError(f"{path} is not a saved conversation: it is not JSON ({e})") from e
        if not isinstance(value, list):
            raise NinferError(
                f"{path} is not a saved conversation: /load takes a JSON array of chat messages"
            )
        system, turns = None, []
        for i, m in enumerate(value):
            where = f"{path}: message {i}"
            if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant"):
                raise NinferError(f"{where} must be an object whose role is system, user or assistant")
            if m["role"] == "system":
                if i:
                    raise NinferError(f"{where}: a system message goes first")
                system = _text(m.get("content"), where)
            elif m["role"] == "assistant":
                turns.append({"role": "assistant", "content": _text(m.get("content"), where)})
            else:
                turns.append({"role": "user", "content": _user_content(m.get("content"), where)})
        self.system, self.turns, self.pending = system, turns, []
        return f"loaded {len(turns)} messages from {path}" + (" (and a system message)" if system else "")


def _text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in content):
        return "".join(str(p.get("text", "")) for p in content)
    raise NinferError(f"{where}: its content must be text")


def _user_content(content: Any, where: str):
    """A loaded user message's content: text, or text and pictures (data URLs) as the REPL keeps them."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise NinferError(f"{where}: its content must be text or an array of text and image_url parts")
    pictures, texts = [], []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind == "image_url":
            url = part["image_url"].get("url") if isinstance(part.get("image_url"), dict) else None
            head, _, data = url.partition(",") if isinstance(url, str) else ("", "", "")
            if not (head.startswith("data:image/") and head.endswith(";base64")):
                raise NinferError(f"{where}: a picture must be a base64 data URL (data:image/...;base64,...)")
            try:
                pictures.append(base64.b64decode(data, validate=True))
            except binascii.Error as e:
                raise NinferError(f"{where}: a picture's data URL is not base64") from e
        else:
            raise NinferError(f"{where}: its parts must be text or image_url")
    return user_content("".join(texts), pictures)
