"""Chat requests: OpenAI's `messages` checked and read into the roles of GPT-2's chat template.

The prompt is the conversation in the template that fine-tuning trains in (`gpt2.tokenizer.chat`): each turn a
role header and its content closed by <|endoftext|>, then the assistant's header. The reply ends where the model
closes its turn with <|endoftext|> (as every completion ends there), or at the request's own stops. Roles:
system (and OpenAI's newer name for it, developer), user, assistant. A content may contain the text
"<|endoftext|>": it stays text, and cannot end a turn.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpt2.tokenizer.chat import ROLES

ROLE_ALIASES = {"developer": "system"}
"""OpenAI's other names for the template's roles."""
MAX_MESSAGES = 256


@dataclass(frozen=True)
class ChatMessage:
    role: str
    """One of the template's roles (`gpt2.tokenizer.chat.ROLES`)."""
    content: str

    def as_dict(self) -> dict[str, str]:
        return {"role": self.role, "content": self.content}


def parse_messages(value: Any) -> tuple[ChatMessage, ...]:
    """OpenAI's `messages` list -> ChatMessages; ValueError naming the bad message otherwise. A content may be
    a string or a list of text parts ({"type": "text", "text": ...}), which are joined."""
    if not isinstance(value, list) or not value:
        raise ValueError("messages must be a non-empty list of {role, content} objects")
    if len(value) > MAX_MESSAGES:
        raise ValueError(f"at most {MAX_MESSAGES} messages per request, got {len(value)}")
    messages = []
    for number, message in enumerate(value):
        if not isinstance(message, dict):
            raise ValueError(f"messages[{number}] must be an object with role and content")
        role = message.get("role")
        if not isinstance(role, str) or role not in (*ROLES, *ROLE_ALIASES):
            accepted = ", ".join((*ROLES, *ROLE_ALIASES))
            raise ValueError(f"messages[{number}].role must be one of {accepted}, got {role!r}")
        messages.append(ChatMessage(ROLE_ALIASES.get(role, role), _content(message.get("content"), number)))
    return tuple(messages)


def _content(content: Any, number: int) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = [part["text"] for part in content if isinstance(part, dict) and isinstance(part.get("text"), str)]
        if len(texts) == len(content) and all(part.get("type") == "text" for part in content):
            return "".join(texts)
    raise ValueError(
        f"messages[{number}].content must be a string or a list of text parts, got {type(content).__name__}"
    )
