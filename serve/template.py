"""Prompts as tokens: the chat template, completion prompts, and the text a generation shows.

The model reads bytes (tokens 0..255 are UTF-8 bytes, 256 is BOS:
:mod:`ringkv.host.model.transformer`) and is not instruction-tuned, so the chat template is plain
text that a reader of the King James Bible's prose can follow, one paragraph per message::

    <BOS>System: {system message}\\n\\n
    User: {user message}\\n\\n
    Assistant: {assistant message}\\n\\n
    User: {user message}\\n\\n
    Assistant: ␣                      <- the reply is generated from here

(``developer`` messages read as ``System``.) The end of a message, ``"\\n\\n"``
(:data:`END_OF_MESSAGE`), is also where a reply stops by itself (as an instruction-tuned
model's end-of-turn token), and a generated BOS ends any generation (the start of another
text). Because a reply that stopped there is followed in the next request by exactly the
bytes the model generated, the next turn's prompt begins with the previous turn's whole
token stream, and the device resumes it from its turn snapshot.

Every message boundary is a **checkpoint** position: the end of the system message (shared by
every conversation behind it) and the end of each later message (where an edited or
regenerated message forks off). A completion's text prompt gets a BOS in front, like
llama.cpp's server, and the text ``<BOS>`` in it is a BOS (a special token's text, as a
Hugging Face tokenizer reads it: :mod:`ringkv.host.model.vocab`; a chat message's text is
bytes only); a prompt given as token ids is taken as it is; a completion prompt's
checkpoint is one token before its end, so that the same prompt sent again (another sample,
another ``max_tokens``) resumes from all of it but that token.
"""

import codecs
from dataclasses import dataclass

from ringkv.host.errors import UsageError
from ringkv.host.model.transformer import BOS, VOCAB
from ringkv.host.model.vocab import encode

__all__ = ["Prompt", "chat_prompt", "completion_prompt", "completion_prompts", "TextStream",
           "END_OF_MESSAGE", "ROLE_LABELS", "GENERATION_PROMPT"]

END_OF_MESSAGE = "\n\n"
ROLE_LABELS = {"system": "System", "developer": "System", "user": "User",
               "assistant": "Assistant"}
GENERATION_PROMPT = "Assistant: "


@dataclass(frozen=True)
class Prompt:
    """The tokens of a request and the checkpoint positions in them (token counts from the
    start: the ends of messages)."""
    tokens: tuple
    checkpoints: tuple = ()


def _content(i, message) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):            # content parts: text only
        parts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" \
                    or not isinstance(part.get("text"), str):
                raise UsageError(f"messages[{i}].content[{j}]: only text parts "
                                 f"({{\"type\": \"text\", \"text\": ...}}) are supported",
                                 param=f"messages[{i}].content")
            parts.append(part["text"])
        return "".join(parts)
    if content is None and message.get("role") == "assistant":
        return ""
    raise UsageError(f"messages[{i}].content must be a string or a list of text parts",
                     param=f"messages[{i}].content")


def chat_prompt(messages) -> Prompt:
    """``messages`` (the OpenAI API's list of ``{"role", "content"}``) through the template;
    a bad message is a :class:`UsageError` naming it."""
    if not isinstance(messages, list) or not messages:
        raise UsageError("messages must be a non-empty list of {role, content} objects",
                         param="messages")
    tokens, marks = [BOS], []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise UsageError(f"messages[{i}] must be an object with role and content",
                             param=f"messages[{i}]")
        role = m.get("role")
        if role not in ROLE_LABELS:
            raise UsageError(f"messages[{i}].role must be one of "
                             f"{', '.join(ROLE_LABELS)}, not {role!r}",
                             param=f"messages[{i}].role")
        text = f"{ROLE_LABELS[role]}: {_content(i, m)}{END_OF_MESSAGE}"
        tokens += text.encode("utf-8")
        marks.append(len(tokens))
    tokens += GENERATION_PROMPT.encode("utf-8")
    return Prompt(tuple(tokens), tuple(marks))


def _with_end_mark(tokens: tuple) -> Prompt:
    """A completion prompt with a checkpoint one token before its end: the longest prefix a
    request with the same prompt can resume from (the last token must go through the model
    for the first generated token's logits)."""
    return Prompt(tokens, (len(tokens) - 1,) if len(tokens) > 1 else ())


def _one_prompt(prompt, param: str) -> Prompt:
    if isinstance(prompt, str):
        if not prompt:
            raise UsageError("prompt must not be empty", param=param)
        return _with_end_mark(tuple(encode(prompt, add_special_tokens=True)))
    if isinstance(prompt, list) and prompt and all(
            isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        bad = [t for t in prompt if not 0 <= t < VOCAB]
        if bad:
            raise UsageError(f"prompt token ids must be 0..{VOCAB - 1} (bytes, {BOS} = BOS), "
                             f"not {bad[0]}", param=param)
        return _with_end_mark(tuple(prompt))
    raise UsageError("prompt must be a non-empty string or a list of token ids",
                     param=param)


def completion_prompts(prompt) -> list[Prompt]:
    """The ``prompt`` of ``/v1/completions``: a string (BOS in front, the text ``<BOS>`` a BOS:
    :func:`ringkv.host.model.vocab.encode`), a list of token ids (0..255 bytes, 256 BOS), or a
    list of either (a batch: one prompt each, in order)."""
    if isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
        return [_one_prompt(p, "prompt") for p in prompt]
    return [_one_prompt(prompt, "prompt")]


def completion_prompt(prompt) -> Prompt:
    """One prompt of :func:`completion_prompts` (a list of several is refused)."""
    prompts = completion_prompts(prompt)
    if len(prompts) > 1:
        raise UsageError("one prompt here, not a list of several", param="prompt")
    return prompts[0]


class TextStream:
    """Generated tokens to text, as they come: UTF-8 decoded incrementally (a character split
    over tokens waits for its last byte), stop sequences found in the bytes and cut off, and
    the text that could still be the start of a stop sequence held back until it cannot.

    ``push(token)`` returns ``(text now safe to show, stopped)``; ``finish()`` the rest when
    the generation ends for another reason. A BOS ends the text (``stopped``) unless
    ``ignore_eos`` (then it shows nothing). With ``min_tokens`` neither a stop sequence nor a
    BOS ends the text before its ``min_tokens``-th token (vLLM's rule: a stop sequence that
    ends at that token or later counts)."""

    def __init__(self, stop=(), *, min_tokens: int = 0, ignore_eos: bool = False):
        self.stops = [s.encode("utf-8") for s in stop]
        self.min_tokens, self.ignore_eos = min_tokens, ignore_eos
        self.buf = bytearray()            # bytes not yet shown
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.stopped = False
        self.count = 0                    # tokens pushed
        self.text = []                    # everything shown, for the non-streamed answer

    def _emit(self, data: bytes, final=False) -> str:
        out = self.decoder.decode(bytes(data), final=final)
        self.text.append(out)
        return out

    def push(self, token: int) -> tuple[str, bool]:
        if self.stopped:
            return "", True
        self.count += 1
        armed = self.count >= self.min_tokens
        if token >= 256:                  # BOS: the start of another text
            if self.ignore_eos or not armed:
                return "", False
            self.stopped = True
            return self._emit(self.buf, final=True), True
        self.buf.append(token)
        if armed:
            # one byte a token: a stop sequence appears first as the end of the buffer
            for s in self.stops:
                if self.buf.endswith(s):
                    self.stopped = True
                    return self._emit(self.buf[:len(self.buf) - len(s)], final=True), True
        # hold back only a tail that could begin a stop sequence
        keep = 0
        for s in self.stops:
            for n in range(min(len(s) - 1, len(self.buf)), 0, -1):
                if self.buf.endswith(s[:n]):
                    keep = max(keep, n)
                    break
        cut = len(self.buf) - keep
        out, self.buf = self._emit(self.buf[:cut]), self.buf[cut:]
        return out, False

    def finish(self) -> str:
        if self.stopped:
            return ""
        out, self.buf = self._emit(self.buf, final=True), bytearray()
        return out

    @property
    def full_text(self) -> str:
        return "".join(self.text)
