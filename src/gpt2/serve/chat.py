"""The chat template: how a list of chat messages becomes one prompt for a model with no chat training.

GPT-2 was trained on web text, not on conversations, and has no special tokens for turns. This server's
template is plain text, one turn per line, each opened by the speaker's name, and ends with the assistant's
name so the model writes the next turn:

    System: You are terse.
    User: Hello!
    Assistant: Hi.
    User: How are you?
    Assistant:

Generation stops at "\\nUser:" (the model starting the user's next turn) besides the request's own stops, and
the reply's leading whitespace is dropped (the model writes " Fine." after "Assistant:"). Roles: system (and
OpenAI's newer name for it, developer), user, assistant. This is the server's stopgap; a fine-tuned chat model
will define its own template.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

ROLE_NAMES = {"system": "System", "developer": "System", "user": "User", "assistant": "Assistant"}
"""Each accepted role and the name its turns start with."""
CHAT_STOP = "\nUser:"
"""Where a reply ends: the model beginning the user's next turn."""
MAX_MESSAGES = 256


@dataclass(frozen=True)
class ChatMessage:
    role: str
    content: str


def render_chat(messages: Sequence[ChatMessage]) -> str:
    """The prompt for `messages` (module docstring).

    >>> render_chat([ChatMessage("user", "Hello!")])
    'User: Hello!\\nAssistant:'
    """
    turns = [f"{ROLE_NAMES[message.role]}: {message.content}" for message in messages]
    return "\n".join([*turns, f"{ROLE_NAMES['assistant']}:"])


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
        if role not in ROLE_NAMES:
            raise ValueError(f"messages[{number}].role must be one of {', '.join(ROLE_NAMES)}, got {role!r}")
        messages.append(ChatMessage(role, _content(message.get("content"), number)))
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
