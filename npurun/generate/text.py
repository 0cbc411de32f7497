"""Text in and out of a generator: the model folder's `tokenizer.json` through the `tokenizers`
library, incremental detokenization for streaming, stop strings, and chat templates.

Streaming: each new token's text is what decoding a short window of the latest tokens adds
to the text already emitted, held back while it ends in an incomplete UTF-8 character
(U+FFFD) or in what could be the start of a stop string; the pieces concatenate to the decoded
continuation (tests/test_generate.py), and a long generation costs the same per token.
"""
from __future__ import annotations

import json
from pathlib import Path

from ..errors import InputError, ModelError


class Tokenizer:
    def __init__(self, folder: Path):
        path = folder / "tokenizer.json"
        if not path.exists():
            raise ModelError(f"{folder}: no tokenizer.json (give token ids instead of text: --ids / prompt=[...])")
        try:
            from tokenizers import Tokenizer as HF
        except ImportError:  # pragma: no cover - a declared dependency
            raise ModelError("text prompts need the tokenizers package: pip install tokenizers") from None
        try:
            self.tok = HF.from_file(str(path))
        except Exception as e:  # noqa: BLE001 - the library's own parse errors
            raise ModelError(f"{path}: not a tokenizers file ({e})") from None
        self.config = _config(folder)
        self.chat_template = self.config.get("chat_template")
        if not self.chat_template and (folder / "chat_template.jinja").exists():
            self.chat_template = (folder / "chat_template.jinja").read_text(encoding="utf-8")
        self.vocab_size = self.tok.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:  # a lone surrogate (JSON's "\ud800"): not text
            raise InputError(f"the prompt is not valid Unicode text ({e.reason} at {e.start})") from None
        return self.tok.encode(text).ids

    def decode(self, ids) -> str:
        return self.tok.decode(list(ids), skip_special_tokens=True)

    def token(self, name) -> int | None:
        """The id of a special token given by name (or as {"content": name})."""
        if isinstance(name, dict):
            name = name.get("content")
        return None if not name else self.tok.token_to_id(name)

    def apply_chat_template(self, messages: list[dict]) -> str:
        """The prompt for chat `messages` ([{"role", "content"}...]): the folder's template
        (Jinja, in a sandbox, as transformers renders it), or for a model without one a plain
        `role: content` transcript ending with `assistant:`."""
        for m in messages:
            if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
                raise InputError("each message must be an object with string 'role' and 'content'")
        if not self.chat_template:
            return "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant:"
        try:
            from jinja2.sandbox import ImmutableSandboxedEnvironment
        except ImportError:
            raise ModelError("this model's chat template needs jinja2: pip install 'npurun[serve]'") from None
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)

        def raise_exception(msg):
            raise InputError(f"chat template: {msg}")
        env.globals["raise_exception"] = raise_exception
        special = {k: (v.get("content") if isinstance(v, dict) else v) for k, v in self.config.items()
                   if k.endswith("_token") and isinstance(v, (str, dict))}
        try:
            return env.from_string(self.chat_template).render(messages=messages, add_generation_prompt=True,
                                                             **special)
        except InputError:
            raise
        except Exception as e:  # noqa: BLE001 - a template error names itself
            raise ModelError(f"the model's chat template failed: {e.__class__.__name__}: {e}") from None


def _config(folder: Path) -> dict:
    p = folder / "tokenizer_config.json"
    if not p.exists():
        return {}
    try:
        return json.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelError(f"{p}: not a readable JSON file ({e})") from None


class Detokenizer:
    """Text pieces for a growing list of new token ids (see the module docstring).

    Two offsets into the ids, as vLLM keeps them: the text of ids[prefix:read] has been
    emitted; each step decodes ids[prefix:] and emits what it adds to that, unless it ends in
    an incomplete character. Then prefix moves to read and read to the end, so every decode
    covers the last emitted tokens (context for decoders that look at neighbours, such as
    sentencepiece's leading space) and the new ones, never the whole generation. Stop strings
    are applied to the emitted text, holding back a tail that could begin one."""

    def __init__(self, tokenizer: Tokenizer, stop: tuple[str, ...] = ()):
        self.tok = tokenizer
        self.stop = tuple(s for s in stop if s)
        self.ids: list[int] = []
        self.text = ""  # released to the caller
        self._held = ""  # decoded but held back (a possible stop string's start)
        self._prefix = self._read = 0
        self.stopped = False

    def add(self, token: int) -> str:
        """The new text once `token` is appended ("" while held back)."""
        self.ids.append(token)
        return self._release(self._decoded(final=False), final=False)

    def finish(self) -> str:
        """Whatever is still held back, at the end of the generation."""
        return self._release(self._decoded(final=True), final=True)

    def _decoded(self, final: bool) -> str:
        if self.stopped:
            return ""
        before = self.tok.decode(self.ids[self._prefix:self._read])
        now = self.tok.decode(self.ids[self._prefix:])
        if len(now) <= len(before) or not now.startswith(before) or (now.endswith("\ufffd") and not final):
            return ""
        self._prefix, self._read = self._read, len(self.ids)
        return now[len(before):]

    def _release(self, piece: str, final: bool) -> str:
        if self.stopped:
            return ""
        pending = self._held + piece
        full = self.text + pending
        for s in self.stop:
            at = full.find(s, max(0, len(self.text) - len(s)))
            if at >= 0:
                self.stopped = True
                out = full[len(self.text):at] if at > len(self.text) else ""
                self.text += out
                self._held = ""
                return out
        hold = 0 if final else max((k for s in self.stop for k in range(1, len(s)) if full.endswith(s[:k])),
                                   default=0)
        hold = min(hold, len(pending))
        out, self._held = pending[:len(pending) - hold], pending[len(pending) - hold:]
        self.text += out
        return out
