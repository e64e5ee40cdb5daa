"""The playground's chat view in a real browser (headless Chromium through selenium, against a real server on a tiny
model): each turn sends the whole conversation, system prompt first, to /v1/chat/completions, and the prompt the
engine receives is the chat template's rendering of it (Jinja, as transformers renders CHAT_TEMPLATE); the sampling
controls and the JSON schema reach the request as the `openai` client sends them; Stop ends a stream early and keeps
the reply so far; model and user text are shown as text, never parsed as HTML.

What the server rendered is read where it takes effect: every SequenceRequest handed to `Engine.submit`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from conftest import headless_chromium
from gpt2.api import LLM
from gpt2.inference import SamplingParams
from gpt2.serve import Engine, SequenceRequest
from gpt2.tokenizer import ByteTokenizer
from gpt2.tokenizer.chat import CHAT_TEMPLATE
from test_serve import MODEL, WAIT_SECONDS, StepGate, health, running, save_model, tiny_gpt

webdriver = pytest.importorskip("selenium.webdriver")
openai = pytest.importorskip("openai")
jinja2 = pytest.importorskip("jinja2")
from selenium.common.exceptions import TimeoutException  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

pytestmark = pytest.mark.slow  # a browser and a server per module, several streamed turns

SYSTEM = "You are terse.\nAnswer in one line."
# the page's controls (element id -> value typed) and the same settings as the API's fields
CONTROLS = {"temperature": "0.8", "top-p": "0.9", "top-k": "40", "presence-penalty": "0.5",
            "frequency-penalty": "0.3", "max-tokens": "12", "seed": "7"}  # fmt: skip
FIELDS = dict(temperature=0.8, top_p=0.9, top_k=40, presence_penalty=0.5, frequency_penalty=0.3, max_tokens=12, seed=7)
SCHEMA = {"type": "object", "properties": {"mood": {"enum": ["calm", "glad"]}}, "required": ["mood"]}


@pytest.fixture(scope="module")
def llm(tmp_path_factory: pytest.TempPathFactory) -> LLM:
    """The tiny byte-level model of the server tests, with room in its context for a conversation."""
    return LLM.load(save_model(tmp_path_factory.mktemp("tiny"), tiny_gpt(block_size=512), ByteTokenizer()))


@pytest.fixture(scope="module")
def base_url(llm: LLM) -> Iterator[str]:
    with running(llm) as url:
        yield url


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with headless_chromium() as driver:
        yield driver


@pytest.fixture
def submitted(monkeypatch: pytest.MonkeyPatch) -> list[SequenceRequest]:
    """Every sequence the server hands its engine while the test runs: the prompt ids it rendered, the params."""
    requests: list[SequenceRequest] = []
    submit = Engine.submit

    def recording(engine: Engine, batch: list[SequenceRequest], sink: Any) -> Any:
        requests.extend(batch)
        return submit(engine, batch, sink)

    monkeypatch.setattr(Engine, "submit", recording)
    return requests


class ChatPage:
    """The chat view, driven as a user drives it."""

    def __init__(self, driver: Any, url: str) -> None:
        self.driver = driver
        self.wait = WebDriverWait(driver, WAIT_SECONDS)
        driver.get("about:blank")  # a new document even where `url` differs from the last only by its #fragment
        driver.get(url)
        self.wait.until(lambda d: d.find_element(By.ID, "model").text == MODEL)

    def set(self, element_id: str, value: str) -> None:
        element = self.driver.find_element(By.ID, element_id)
        self.driver.execute_script("arguments[0].value = arguments[1];", element, value)

    def send(self, text: str) -> None:
        self.set("message", text)
        self.driver.find_element(By.ID, "send").click()

    def status(self) -> str:
        return self.driver.find_element(By.ID, "chat-status").text

    def wait_for(self, status: str) -> None:
        try:
            self.wait.until(lambda d: self.status().startswith(status) and d.find_element(By.ID, "send").is_enabled())
        except TimeoutException:
            raise AssertionError(f"the page never said {status!r}; it says {self.status()!r}") from None

    def shown(self) -> list[dict[str, str]]:
        """The conversation in the log, as messages."""
        script = """return [...document.querySelectorAll('#chat-log .msg')].map(
            (m) => ({role: m.dataset.role, content: m.querySelector('.content').textContent}));"""
        return self.driver.execute_script(script)


def rendered(messages: list[dict[str, str]]) -> str:
    """The chat template's prompt for the next reply, as transformers' apply_chat_template renders it."""
    return jinja2.Template(CHAT_TEMPLATE).render(messages=messages, add_generation_prompt=True)


def test_each_turn_prompts_the_engine_with_the_template_rendering_of_the_whole_conversation(
    base_url: str, browser: Any, llm: LLM, submitted: list[SequenceRequest]
) -> None:
    page = ChatPage(browser, base_url)
    browser.find_element(By.ID, "tab-chat").click()
    page.set("system", SYSTEM)
    page.set("max-tokens", "12")
    page.set("seed", "3")
    page.send("Hi <b>there</b>")
    page.wait_for("done")
    page.send("And then?")
    page.wait_for("done")
    message = browser.find_element(By.ID, "message")  # the third by keyboard: Shift+Enter breaks the line, Enter sends
    message.send_keys("Why?")
    webdriver.ActionChains(browser).key_down(Keys.SHIFT).send_keys(Keys.ENTER).key_up(Keys.SHIFT).perform()
    message.send_keys("Say more.", Keys.ENTER)
    page.wait_for("done")

    shown = page.shown()
    questions = ["Hi <b>there</b>", "And then?", "Why?\nSay more."]
    assert [m["role"] for m in shown] == ["user", "assistant"] * 3
    assert [m["content"] for m in shown[::2]] == questions
    assert all(m["content"] for m in shown[1::2])
    assert browser.find_elements(By.CSS_SELECTOR, "#chat-log .content *") == []  # text stays text
    conversation = [{"role": "system", "content": SYSTEM}, *shown]
    assert len(submitted) == 3
    for turn, request in enumerate(submitted):
        prompt = rendered(conversation[: 2 + 2 * turn])  # the system prompt, earlier turns, this question
        assert llm.tokenizer.decode(list(request.prompt)) == prompt
        assert list(request.prompt) == llm.tokenizer.encode(prompt, allowed_special="all")
    assert f"prompt {len(submitted[2].prompt)} tokens" in page.status()


def test_the_sampling_controls_and_the_schema_reach_the_request_as_the_openai_client_sends_them(
    base_url: str, browser: Any, submitted: list[SequenceRequest]
) -> None:
    pytest.importorskip("xgrammar")
    page = ChatPage(browser, f"{base_url}/#chat")
    page.set("system", SYSTEM)
    for element_id, value in CONTROLS.items():
        page.set(element_id, value)
    browser.find_element(By.CSS_SELECTOR, "#schema-box summary").click()
    page.set("json-schema", json.dumps(SCHEMA, indent=2))
    page.send("How do you feel?")
    page.wait_for("done")
    reply = page.shown()[1]["content"]

    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0)
    fields = {name: value for name, value in FIELDS.items() if name != "top_k"}
    answer = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": "How do you feel?"}],
        response_format={"type": "json_schema", "json_schema": {"name": "mood", "schema": SCHEMA}},
        extra_body={"top_k": FIELDS["top_k"]},
        **fields,
    )
    assert reply == answer.choices[0].message.content
    page_request, client_request = submitted
    assert page_request.params == SamplingParams(**FIELDS, json_schema=SCHEMA) == client_request.params
    assert page_request.prompt == client_request.prompt


def test_stop_ends_the_stream_early_and_the_reply_so_far_stays_in_the_conversation(
    base_url: str, browser: Any, llm: LLM, submitted: list[SequenceRequest], monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = StepGate(monkeypatch)  # the engine decodes only the steps the test lets through
    try:
        page = ChatPage(browser, f"{base_url}/#chat")
        page.set("temperature", "0")  # greedy: this model's text runs on (tiny_gpt), only Stop can end it early
        page.set("max-tokens", "400")
        page.send("Tell me a story.")
        gate.steps_until(lambda: page.shown()[1]["content"] != "")
        browser.find_element(By.ID, "chat-stop").click()
        page.wait_for("stopped")
        gate.steps_until(lambda: health(base_url)["active"] == 0)  # the server cancels the sequence
    finally:
        gate.open()
    assert len(gate.sizes) < 400  # decode steps taken: the stream ended long before max_tokens
    partial = page.shown()[1]["content"]
    assert partial

    page.set("max-tokens", "4")
    page.send("Go on.")
    page.wait_for("done")
    conversation = [{"role": "user", "content": "Tell me a story."}, {"role": "assistant", "content": partial}]
    assert llm.tokenizer.decode(list(submitted[-1].prompt)) == rendered([*conversation, page.shown()[2]])


def test_a_schema_that_is_not_json_is_one_line_in_the_page_and_sends_nothing(
    base_url: str, browser: Any, submitted: list[SequenceRequest]
) -> None:
    page = ChatPage(browser, f"{base_url}/#chat")
    browser.find_element(By.CSS_SELECTOR, "#schema-box summary").click()
    page.set("json-schema", "{type: object}")
    page.send("Hello")
    assert page.status().startswith("the JSON schema is not valid JSON")
    assert page.shown() == [] and submitted == []
    assert browser.find_element(By.ID, "message").get_attribute("value") == "Hello"  # kept to send again


def test_a_request_the_server_refuses_is_taken_back_with_its_message(base_url: str, browser: Any) -> None:
    page = ChatPage(browser, f"{base_url}/#chat")
    page.set("temperature", "0.5")
    page.set("top-k", "-3")
    page.send("Hello")
    page.wait_for("Error: top_k")
    assert page.shown() == []
    assert browser.find_element(By.ID, "message").get_attribute("value") == "Hello"


def test_the_completion_view_stays_the_default_and_the_chat_view_has_its_own_link(base_url: str, browser: Any) -> None:
    ChatPage(browser, base_url)
    assert browser.find_element(By.ID, "completion-view").is_displayed()
    assert not browser.find_element(By.ID, "chat-view").is_displayed()
    browser.find_element(By.ID, "tab-chat").click()
    assert browser.current_url.endswith("/#chat")
    ChatPage(browser, f"{base_url}/#chat")
    assert browser.find_element(By.ID, "chat-view").is_displayed()
    assert not browser.find_element(By.ID, "completion-view").is_displayed()
