"""Talking with a model in GPT-2's chat template (`gpt2.tokenizer.chat`): the conversation so far is the prompt,
the reply streams until the model closes its turn with <|endoftext|>."""

from __future__ import annotations

from collections.abc import Iterator

from gpt2.inference import SamplingParams, stream_text
from gpt2.model import GPT
from gpt2.tokenizer.chat import encode_chat
from gpt2.tokenizer.protocol import TextTokenizer


class ChatSession:
    """A conversation with a model in the chat template: `reply(text)` streams the assistant's answer as text
    pieces and remembers both turns. When the conversation outgrows the context, the oldest turns are left out of
    the prompt (a system message is kept)."""

    def __init__(self, model: GPT, tokenizer: TextTokenizer, params: SamplingParams, system: str | None = None) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.params = params
        self.messages: list[dict[str, str]] = [{"role": "system", "content": system}] if system else []

    def _prompt_ids(self) -> list[int]:
        context = self.model.config.block_size - self.params.max_tokens
        system = self.messages[:1] if self.messages[0]["role"] == "system" else []
        turns = self.messages[len(system) :]
        while True:
            ids, _ = encode_chat(system + turns, self.tokenizer, add_generation_prompt=True)
            if len(ids) <= context or len(turns) <= 1:
                return ids[-max(context, 1) :]
            turns = turns[1:]

    def reply(self, text: str) -> Iterator[str]:
        """Add the user's `text` and yield the reply in pieces while it is generated."""
        self.messages.append({"role": "user", "content": text})
        self.model.eval()
        answer = ""
        for piece in stream_text(self.model, self.tokenizer, self._prompt_ids(), self.params):
            answer += piece
            yield piece
        self.messages.append({"role": "assistant", "content": answer})
