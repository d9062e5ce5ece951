"""JSON as TorchServe 0.12 reads ``models={...}`` and ``model_snapshot``: Gson's ``fromJson``, which
is lenient (``JsonReader.setLenient(true)``). Beyond strict JSON it takes what users write by
hand in a config.properties: strings and names in single quotes, names and string values
without quotes (``{m: {'1.0': {marName: m.mar}}}``), comments (``//`` or ``#`` to the end of the
line, ``/* ... */``), ``;`` between members or elements, and ``=`` or ``=>`` between a name and
its value. Like Gson it refuses a trailing comma in an object and text after the value.

``loads`` tries the strict reading first (the common case, and Python's exact numbers) and this
one only when that fails. Torch-free; imports nothing of ours.
"""

from __future__ import annotations

import json
from typing import Any

_DELIMITERS = set("/\\;#={}[]:, \t\f\r\n'\"")
_ESCAPES = {"b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
MAX_DEPTH = 64


def loads(text: str) -> Any:
    """The value of ``text``; ``ValueError`` (a ``json.JSONDecodeError`` for strict JSON's
    mistakes) when Gson would refuse it too."""
    try:
        return json.loads(text)
    except (json.JSONDecodeError, RecursionError) as strict:
        try:
            return _Reader(text).document()
        except ValueError:
            raise strict from None


class _Reader:
    def __init__(self, text: str) -> None:
        self.text, self.i = text, 0

    def document(self) -> Any:
        if self._peek() == "":
            return None  # an empty document: Gson's fromJson answers null
        value = self._value(0)
        if self._peek() != "":
            self._fail("text after the JSON value")
        return value

    def _fail(self, what: str) -> None:
        raise ValueError(f"{what} at character {self.i}")

    def _peek(self) -> str:
        """The next character that is not whitespace or a comment ("" at the end)."""
        text = self.text
        while self.i < len(text):
            ch = text[self.i]
            if ch in " \t\r\n\f":
                self.i += 1
            elif ch == "#" or text.startswith("//", self.i):
                end = text.find("\n", self.i)
                self.i = len(text) if end < 0 else end + 1
            elif text.startswith("/*", self.i):
                end = text.find("*/", self.i + 2)
                if end < 0:
                    self._fail("an unterminated comment")
                self.i = end + 2
            else:
                return ch
        return ""

    def _value(self, depth: int) -> Any:
        if depth > MAX_DEPTH:
            self._fail("JSON nested too deep")
        ch = self._peek()
        if ch == "{":
            return self._object(depth)
        if ch == "[":
            return self._array(depth)
        if ch in "'\"":
            return self._quoted(ch)
        return self._literal()

    def _object(self, depth: int) -> dict[str, Any]:
        self.i += 1
        out: dict[str, Any] = {}
        if self._peek() == "}":
            self.i += 1
            return out
        while True:
            ch = self._peek()
            name = self._quoted(ch) if ch in "'\"" else self._unquoted()
            if not name and ch not in "'\"":
                self._fail("a name expected")
            sep = self._peek()
            if sep not in ":=":
                self._fail("':' expected")
            self.i += 2 if self.text.startswith("=>", self.i) else 1
            out[name] = self._value(depth + 1)
            ch = self._peek()
            self.i += 1
            if ch == "}":
                return out
            if ch not in ",;":
                self._fail("',' or '}' expected")

    def _array(self, depth: int) -> list[Any]:
        self.i += 1
        out: list[Any] = []
        if self._peek() == "]":
            self.i += 1
            return out
        while True:
            out.append(self._value(depth + 1))
            ch = self._peek()
            self.i += 1
            if ch == "]":
                return out
            if ch not in ",;":
                self._fail("',' or ']' expected")

    def _quoted(self, quote: str) -> str:
        text, out = self.text, []
        self.i += 1
        while self.i < len(text):
            ch = text[self.i]
            self.i += 1
            if ch == quote:
                return "".join(out)
            if ch != "\\":
                out.append(ch)
                continue
            esc = text[self.i : self.i + 1]
            if esc == "u":
                digits = text[self.i + 1 : self.i + 5]
                try:
                    out.append(chr(int(digits, 16)))
                except ValueError:
                    self._fail("a bad \\u escape")
                self.i += 5
                continue
            out.append(_ESCAPES.get(esc, esc))  # \" \' \\ \/ and any other: the character
            self.i += 1
        self._fail("an unterminated string")
        return ""

    def _unquoted(self) -> str:
        start = self.i
        while self.i < len(self.text) and self.text[self.i] not in _DELIMITERS:
            self.i += 1
        return self.text[start : self.i]

    def _literal(self) -> Any:
        word = self._unquoted()
        if not word:
            self._fail("a value expected")
        if word in ("true", "false", "null"):
            return {"true": True, "false": False, "null": None}[word]
        try:
            return json.loads(word)  # a number in JSON's form: int or float
        except ValueError:
            return word  # Gson: an unquoted string
