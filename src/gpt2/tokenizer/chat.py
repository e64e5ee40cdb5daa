"""GPT-2's chat template: turns delimited by <|endoftext|>, each opened by a role header on its own line.

GPT-2 has no chat format of its own, and its vocabulary only one special token, so the template uses that one to
end every turn (generation then stops at the end of the assistant's turn, as it stops at the end of a document)
and writes roles as plain-text headers:

    <|system|>
    You are terse.<|endoftext|><|user|>
    Hi<|endoftext|><|assistant|>
    Hello.<|endoftext|>

A prompt for the next reply ends with the assistant header "<|assistant|>\\n". Headers are ordinary text (they
encode to several BPE tokens); only <|endoftext|> is the special id. In training the loss counts the assistant's
content and its closing <|endoftext|>, never headers or other roles' turns. The same template, as Jinja for
transformers' `apply_chat_template`, is `CHAT_TEMPLATE`; `save_chat_template` stores it with the model as
chat_template.json. Fine-tuning trains in it, `gpt2 chat` and the server's /v1/chat/completions prompt in it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gpt2.runtime.files import atomic_write_text
from gpt2.tokenizer.protocol import TextTokenizer

ROLES = ("system", "user", "assistant")
TRAINED_ROLE = "assistant"
CHAT_TEMPLATE_FILE = "chat_template.json"
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] + '<|endoftext|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)


def header(role: str) -> str:
    """The text that opens a turn of `role`."""
    return f"<|{role}|>\n"


def render_chat(messages: Sequence[dict[str, str]], add_generation_prompt: bool = False) -> str:
    """The conversation as text in the template (what CHAT_TEMPLATE renders).

    >>> render_chat([{"role": "user", "content": "Hi"}], add_generation_prompt=True)
    '<|user|>\\nHi<|endoftext|><|assistant|>\\n'
    """
    text = "".join(header(m["role"]) + m["content"] + "<|endoftext|>" for m in messages)
    return text + header(TRAINED_ROLE) if add_generation_prompt else text


def encode_chat(
    messages: Any, tokenizer: TextTokenizer, *, add_generation_prompt: bool = False, where: str = "messages"
) -> tuple[list[int], list[bool]]:
    """Token ids of a conversation in the template, and per id whether it is trained (assistant content and
    its closing end-of-text). Headers and contents are encoded separately, so the split is exact. `where` names
    the record in errors (file:line)."""
    if not isinstance(messages, list) or not messages:
        raise ValueError(f"{where}: 'messages' must be a non-empty list of {{'role': ..., 'content': ...}}")
    ids: list[int] = []
    trained: list[bool] = []
    for turn, message in enumerate(messages):
        role = message.get("role") if isinstance(message, dict) else None
        content = message.get("content") if isinstance(message, dict) else None
        if role not in ROLES:
            raise ValueError(f"{where}: message {turn} has role {role!r}; every message needs a role in {ROLES}")
        if not isinstance(content, str):
            raise ValueError(f"{where}: message {turn} ({role}) has no 'content' string")
        head = tokenizer.encode(header(role))
        body = [*tokenizer.encode(content), tokenizer.eot_token]
        ids += head + body
        trained += [False] * len(head) + [role == TRAINED_ROLE] * len(body)
    if add_generation_prompt:
        head = tokenizer.encode(header(TRAINED_ROLE))
        ids += head
        trained += [False] * len(head)
    return ids, trained


def save_chat_template(directory: str | Path) -> Path:
    """Write chat_template.json (transformers reads it beside the tokenizer files) into `directory`."""
    path = Path(directory) / CHAT_TEMPLATE_FILE
    atomic_write_text(path, json.dumps({"chat_template": CHAT_TEMPLATE}, indent=2) + "\n")
    return path
