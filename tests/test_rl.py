"""Reinforcement learning (gpt2.rl): rollouts drawn by the serving engine from the policy's current weights, the
prompts and reward functions, the group advantages, the config, and `gpt2 rl` as a user runs it (steps,
checkpoints, an exact resume, one-line errors). GRPO's loss against TRL's is tests/test_grpo.py."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import gpt2
from gpt2.config import GPTConfig
from gpt2.inference import SamplingParams, generate
from gpt2.model import GPT
from gpt2.rl import RLConfig, Rollouts, addition_prompts, group_advantages, load_reward, read_prompts, rl
from gpt2.rl.rewards import exact_answer, score
from gpt2.tokenizer import ByteTokenizer
from gpt2.weights import save_pretrained

EOT = ByteTokenizer.eot_token


def byte_gpt(seed: int = 0) -> GPT:
    """gpt2-tiny over the byte tokenizer, weights perturbed away from the plain init, in eval mode."""
    torch.manual_seed(seed)
    model = GPT(GPTConfig.from_name("gpt2-tiny", vocab_size=257, block_size=64))
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.05 * torch.randn_like(parameter))
    return model.eval()


@pytest.fixture
def byte_model_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "policy"
    save_pretrained(byte_gpt(), directory)
    ByteTokenizer().save(directory)
    return directory


# --------------------------------------------------------------------------------------- rollouts
def greedy_reference(model: GPT, prompt: list[int], max_tokens: int) -> list[int]:
    """What the plain decode loop draws greedily, cut after its first end-of-text."""
    out = generate(model, torch.tensor([prompt]), max_tokens, temperature=0, native=False)[0, len(prompt) :].tolist()
    return out[: out.index(EOT) + 1] if EOT in out else out


def test_rollouts_sample_from_the_policys_weights_after_each_optimizer_step() -> None:
    model = byte_gpt()
    tokenizer = ByteTokenizer()
    prompts = [list(b"12+34="), list(b"hello"), list(b"a")]
    greedy = [SamplingParams(max_tokens=12, temperature=0)] * len(prompts)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
    with Rollouts(model, tokenizer, max_batch=2) as rollouts:  # fewer rows than sequences: rows are reused
        before = [c.token_ids for c in rollouts.sample(prompts, greedy)]
        assert before == [greedy_reference(model, p, 12) for p in prompts]
        for _ in range(2):  # in-place updates of the very tensors the engine reads
            loss = model(torch.tensor([list(b"zzzzzzzz")]), torch.tensor([list(b"zzzzzzzz")])).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        after = [c.token_ids for c in rollouts.sample(prompts, greedy)]
    assert after == [greedy_reference(model, p, 12) for p in prompts]
    assert after != before


def test_a_completion_keeps_its_closing_end_of_text_and_its_text_leaves_it_out() -> None:
    model = byte_gpt()
    with torch.no_grad():  # end-of-text the likeliest token after anything: the final LayerNorm's output points to it
        model.transformer.ln_f.weight.zero_()
        model.transformer.ln_f.bias.fill_(1.0)
        model.lm_head.weight[EOT].fill_(1.0)  # tied to wte
    with Rollouts(model, ByteTokenizer()) as rollouts:
        [completion] = rollouts.sample([list(b"x")], [SamplingParams(max_tokens=5, temperature=0)])
    assert completion.token_ids[-1] == EOT and completion.finish_reason == "stop"
    assert EOT not in list(completion.text.encode())


def test_seeded_rollouts_repeat_and_differ_by_seed() -> None:
    model = byte_gpt()
    with Rollouts(model, ByteTokenizer()) as rollouts:
        params = [SamplingParams(max_tokens=10, seed=seed) for seed in (1, 2, 1)]
        first = rollouts.sample([list(b"ab")] * 3, params)
        again = rollouts.sample([list(b"ab")] * 3, params)
    assert [c.token_ids for c in first] == [c.token_ids for c in again]
    assert first[0].token_ids == first[2].token_ids != first[1].token_ids


def test_rollouts_refuse_a_policy_in_training_mode() -> None:
    with pytest.raises(ValueError, match="eval mode"):
        Rollouts(byte_gpt().train(), ByteTokenizer())


# ------------------------------------------------------------------------------------- advantages
def test_group_advantages_are_normalized_within_each_group() -> None:
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0, 3.0, 3.0, 3.0, 3.0])
    advantages = group_advantages(rewards, num_generations=4)
    std = torch.tensor([1.0, 0.0, 1.0, 0.0]).std()  # Bessel-corrected, as TRL's
    torch.testing.assert_close(advantages[:4], torch.tensor([0.5, -0.5, 0.5, -0.5]) / (std + 1e-4))
    assert advantages[4:].tolist() == [0.0] * 4  # a group of equal rewards teaches nothing
    assert group_advantages(rewards, 4, "none")[:4].tolist() == [0.5, -0.5, 0.5, -0.5]


def test_an_unscorable_completion_gets_advantage_zero_and_leaves_the_baseline() -> None:
    advantages = group_advantages(torch.tensor([1.0, math.nan, 0.0]), num_generations=3, scale_rewards="none")
    assert advantages.tolist() == [0.5, 0.0, -0.5]


# -------------------------------------------------------------------------------- prompts and rewards
def test_prompt_rows_reach_the_reward_function_by_column(tmp_path: Path) -> None:
    path = tmp_path / "prompts.jsonl"
    rows = [{"prompt": "2+2=", "answer": "4", "level": 1}, {"prompt": [{"role": "user", "content": "hi"}]}]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    read = read_prompts(str(path), ByteTokenizer(), max_prompt_tokens=60)
    assert read[0].ids == list(b"2+2=") and read[0].columns == {"answer": "4", "level": 1}
    seen = {}

    def reward(prompts, completions, **columns):
        seen.update(prompts=prompts, completions=completions, **columns)
        return [0.5, None]

    assert score(reward, read, ["4", "hello"], [[52], [104]])[0] == 0.5
    assert math.isnan(score(reward, read, ["4", "hello"], [[52], [104]])[1])
    assert seen["answer"] == ["4", None] and seen["level"] == [1, None] and seen["completion_ids"] == [[52], [104]]
    assert seen["completions"] == [[{"role": "assistant", "content": "4"}], [{"role": "assistant", "content": "hello"}]]


def test_a_prompt_too_long_for_the_completion_is_named(tmp_path: Path) -> None:
    path = tmp_path / "prompts.jsonl"
    path.write_text(json.dumps({"prompt": "x" * 50}) + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"prompts.jsonl:1: the prompt has 50 tokens"):
        read_prompts(str(path), ByteTokenizer(), max_prompt_tokens=40)


def test_a_reward_that_returns_the_wrong_count_or_kind_is_refused(tmp_path: Path) -> None:
    rows = read_prompts("builtin:addition", ByteTokenizer(), 60)[:2]
    with pytest.raises(ValueError, match="must return a list of 2 rewards .* got 1"):
        score(lambda prompts, completions, **_: [1.0], rows, ["1", "2"], [[49], [50]])
    with pytest.raises(ValueError, match="returned 'yes'; each reward must be a number"):
        score(lambda prompts, completions, **_: [1.0, "yes"], rows, ["1", "2"], [[49], [50]])
    numpy = pytest.importorskip("numpy")
    assert score(lambda prompts, completions, **_: numpy.array([1, 0.5], dtype=numpy.float32), rows, ["1", "2"],
                 [[49], [50]]) == [1.0, 0.5]  # fmt: skip


def test_the_addition_task_rewards_the_exact_answer_only() -> None:
    answers = ["46", "46", "46", "46"]
    assert exact_answer([], [" 46\n", "46 is it", "460", "4"], answers) == [1.0, 1.0, 0.0, 0.0]


def test_the_addition_tasks_test_split_holds_no_train_sum() -> None:
    train, test = addition_prompts("train"), addition_prompts("test")
    assert (len(train), len(test)) == (2000, 500)
    assert not {row["prompt"] for row in train} & {row["prompt"] for row in test}
    for row in train + test:
        a, b = row["prompt"].removesuffix("=").split("+")
        assert int(a) + int(b) == int(row["answer"]) and max(int(a), int(b)) < 100
    assert [row.ids for row in read_prompts("builtin:addition:test", ByteTokenizer(), 60)[:1]] == [list(b"12+45=")]
    with pytest.raises(ValueError, match="splits are train, test, got 'dev'"):
        read_prompts("builtin:addition:dev", ByteTokenizer(), 60)


@pytest.mark.parametrize(("spec", "message"), [
    ("rewards.py", "is not FILE.py:FUNCTION"),
    ("missing.py:reward", "does not exist"),
    ("{dir}/rewards.py:nope", r"has no function 'nope' \(functions: reward\)"),
    ("{dir}/broken.py:reward", "importing .*broken.py failed: SyntaxError"),
    ("builtin:chess", "unknown built-in task 'chess'"),
])  # fmt: skip
def test_a_bad_reward_spec_is_named(tmp_path: Path, spec: str, message: str) -> None:
    (tmp_path / "rewards.py").write_text("def reward(prompts, completions, **columns):\n    return [0.0]\n")
    (tmp_path / "broken.py").write_text("def reward(:\n")
    with pytest.raises((ValueError, FileNotFoundError), match=message):
        load_reward(spec.format(dir=tmp_path))


# ------------------------------------------------------------------------------------------ config
def test_config_takes_trl_names_and_training_keys() -> None:
    config = RLConfig.from_settings(["num_generations=4", "epsilon_high=0.28", "loss_type=grpo", "max_steps=7",
                                     "train.learning_rate=1e-4"], model="m")  # fmt: skip
    loss = config.loss()
    assert (loss.epsilon_low, loss.epsilon_high, loss.loss_type) == (0.2, 0.28, "grpo")
    assert config.train.schedule.max_steps == 7 and config.train.optimizer.learning_rate == 1e-4


@pytest.mark.parametrize(("setting", "message"), [
    ("num_generations=1", "num_generations must be at least 2"),
    ("loss_type=ppo", "loss_type"),
    ("temperature=0", "temperature must be at least"),
    ("grad_accum_steps=2", "raise batch_prompts instead"),
    ("beta=-1", "must be >= 0"),
    ("nope=1", "unknown RL setting 'nope'"),
])  # fmt: skip
def test_bad_settings_are_named(setting: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RLConfig.from_settings([setting])


# ------------------------------------------------------------------------------------------ the run
def test_a_run_raises_the_reward_and_tensorboard_gets_its_figures(tmp_path: Path, byte_model_dir: Path) -> None:
    """A reward the policy can reach fast (short completions score more), through the Python API: the reward
    rises, on held-out prompts too (greedy, at the start and the end), and TRL's figures reach TensorBoard beside
    the loss."""
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"{word}:"}) + "\n" for word in ("ab", "cd", "ef", "gh")))
    held_out = tmp_path / "held_out.jsonl"
    held_out.write_text("".join(json.dumps({"prompt": f"{word}:"}) + "\n" for word in ("xy", "zw")))
    reward = tmp_path / "short.py"
    reward.write_text("def short(prompts, completions, **_):\n    return [-len(c) for c in completions]\n")
    config = RLConfig.from_settings(
        ["num_generations=8", "batch_prompts=4", "max_completion_length=8", "max_steps=12", "learning_rate=3e-2",
         "checkpoint_interval=0", "log_to=tensorboard", "device=cpu", "dtype=float32", "seed=0"],
        model=str(byte_model_dir), prompts=str(prompts), reward=f"{reward}:short", out_dir=str(tmp_path / "out"),
        eval_prompts=str(held_out),
    )  # fmt: skip
    result = rl(config)
    assert list(result.eval_rewards) == [0, 12] and result.eval_rewards[12] > result.eval_rewards[0]
    assert (tmp_path / "out" / "reward.png").read_bytes().startswith(b"\x89PNG")
    records = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    rewards = [r["reward"] for r in records if "reward" in r]
    assert len(rewards) == 12 and sum(rewards[-3:]) / 3 > sum(rewards[:3]) / 3 + 1  # shorter by a token and more
    assert result.last_reward == rewards[-1]
    events = EventAccumulator(str(tmp_path / "out" / "tensorboard"), size_guidance={"scalars": 0}).Reload()
    assert {"loss", "reward", "reward_std", "completions/mean_length", "clip_ratio/region_mean"} <= set(
        events.Tags()["scalars"]
    )
    assert [event.value for event in events.Scalars("reward")] == pytest.approx(rewards)


def run_with_reward(tmp_path: Path, model: Path, reward_source: str, *settings: str) -> list[dict]:
    """A short in-process run on two prompts with the reward function `reward_source` defines as `reward`; the
    metrics.jsonl records."""
    tmp_path.mkdir(exist_ok=True)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": word}) + "\n" for word in ("ab", "cd")))
    reward = tmp_path / "reward.py"
    reward.write_text(reward_source)
    config = RLConfig.from_settings(
        ["num_generations=4", "batch_prompts=2", "max_steps=2", "checkpoint_interval=0", "device=cpu",
         "dtype=float32", "seed=0", *settings],
        model=str(model), prompts=str(prompts), reward=f"{reward}:reward", out_dir=str(tmp_path / "out"),
    )  # fmt: skip
    rl(config)
    return [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]


def test_truncated_completions_leave_the_loss_when_masked(tmp_path: Path, byte_model_dir: Path) -> None:
    source = "def reward(prompts, completions, **_):\n    return [float(len(set(c))) for c in completions]\n"
    records = run_with_reward(tmp_path, byte_model_dir, source, "max_completion_length=3",
                              "mask_truncated_completions=true", "temperature=3.0")  # fmt: skip
    steps = [r for r in records if "loss" in r]
    cut = [r["completions/clipped_ratio"] for r in records if "reward" in r]
    for step, ratio in zip(steps, cut, strict=True):  # only completions that ended on end-of-text count
        assert (step["grad_norm"] == 0.0) == (ratio == 1.0)
    assert cut[0] == 1.0  # at temperature 3 over 257 bytes, nothing ends on end-of-text within 3 tokens
    unmasked = run_with_reward(tmp_path / "unmasked", byte_model_dir, source, "max_completion_length=3",
                               "temperature=3.0")  # fmt: skip
    assert [r for r in unmasked if "loss" in r][0]["grad_norm"] > 0  # the same completions count when not masked


def test_completions_follow_a_json_schema_through_the_grammar_path(tmp_path: Path, byte_model_dir: Path) -> None:
    pytest.importorskip("xgrammar")
    seen = tmp_path / "seen.jsonl"
    source = (
        "import json\n"
        "def reward(prompts, completions, **_):\n"
        f"    with open({str(seen)!r}, 'a') as f:\n"
        "        f.write(''.join(json.dumps(c) + '\\n' for c in completions))\n"
        "    return [1.0] * len(completions)\n"
    )
    schema = json.dumps({"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
                         "additionalProperties": False})  # fmt: skip
    run_with_reward(tmp_path, byte_model_dir, source, f"json_schema={json.dumps(schema)}",
                    "max_completion_length=40")  # fmt: skip
    completions = [json.loads(line) for line in seen.read_text().splitlines()]
    assert len(completions) == 16
    for text in completions:
        assert json.loads(text).keys() == {"ok"}


# ----------------------------------------------------------------------------------------- the CLI
def child_env() -> dict[str, str]:
    source = str(Path(gpt2.__file__).parents[1])
    return {**os.environ, "PYTHONPATH": os.pathsep.join([source, os.environ.get("PYTHONPATH", "")])}


def rl_command(model: Path, prompts: Path, reward: str, out: Path, *extra: str) -> list[str]:
    args = [sys.executable, "-m", "gpt2.cli", "rl", "--model", str(model), "--prompts", str(prompts), "--reward",
            reward, "--out", str(out), "--no-progress", *extra]  # fmt: skip
    for key, value in dict(num_generations=4, batch_prompts=2, max_completion_length=6, max_steps=4,
                           checkpoint_interval=2, learning_rate=1e-2, beta=0.04, num_iterations=2, device="cpu",
                           dtype="float32", seed=0).items():  # fmt: skip
        args += ["--set", f"{key}={value}"]
    return args


@pytest.fixture
def task(tmp_path: Path) -> tuple[Path, str]:
    """A prompts file and a reward function file: reward the completions that start with the row's letter."""
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"say {c}:", "letter": c}) + "\n" for c in "abc"))
    reward = tmp_path / "letters.py"
    reward.write_text(
        "def starts_with(prompts, completions, letter, **_):\n"
        "    return [float(c.startswith(x)) + 0.1 * len(c) for c, x in zip(completions, letter)]\n"
    )
    return prompts, f"{reward}:starts_with"


@pytest.mark.slow  # three runs of the command, each a fresh process
def test_gpt2_rl_trains_checkpoints_and_resumes_exactly(tmp_path: Path, byte_model_dir: Path, task) -> None:
    prompts, reward = task
    whole = subprocess.run(rl_command(byte_model_dir, prompts, reward, tmp_path / "whole"), env=child_env(),
                           capture_output=True, text=True, timeout=600)  # fmt: skip
    assert whole.returncode == 0, whole.stderr
    assert "step 4: reward" in whole.stdout
    records = [json.loads(line) for line in (tmp_path / "whole" / "metrics.jsonl").read_text().splitlines()]
    rl_lines = [r for r in records if "clip_ratio/region_mean" in r]
    assert [r["step"] for r in rl_lines] == [1, 2, 3, 4]
    assert {"reward", "reward_std", "kl", "completions/mean_length"} <= set(rl_lines[0])
    assert "reward" not in rl_lines[1]  # num_iterations=2: step 2 trains on step 1's completions
    assert rl_lines[1]["kl"] > 0  # the policy has moved away from the reference
    assert sorted(p.name for p in (tmp_path / "whole" / "checkpoints").iterdir()) == ["step_00000002", "step_00000004"]

    out = tmp_path / "split"
    first = subprocess.run(rl_command(byte_model_dir, prompts, reward, out, "--stop-at-step", "3"), env=child_env(),
                           capture_output=True, text=True, timeout=600)  # fmt: skip
    assert first.returncode == 0, first.stderr
    again = subprocess.run(rl_command(byte_model_dir, prompts, reward, out, "--resume"), env=child_env(),
                           capture_output=True, text=True, timeout=600)  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert "resuming at step 3" in again.stderr
    resumed = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in resumed if "loss" in r] == [1, 2, 3, 4]
    # step 3 saved mid-way through a batch (num_iterations=2): the resumed step 4 trains on that same batch
    whole_weights = load_file(tmp_path / "whole" / "model.safetensors")
    split_weights = load_file(out / "model.safetensors")
    for name, tensor in whole_weights.items():
        torch.testing.assert_close(split_weights[name], tensor, rtol=0, atol=1e-6, msg=name)


@pytest.mark.parametrize(("reward", "message"), [
    ("letters.py", "is not FILE.py:FUNCTION"),
    ("{dir}/letters.py:nope", "has no function 'nope'"),
])  # fmt: skip
def test_gpt2_rl_names_a_bad_reward_in_one_line(tmp_path: Path, byte_model_dir: Path, task, reward: str,
                                                message: str) -> None:  # fmt: skip
    prompts, _ = task
    out = tmp_path / "out"
    done = subprocess.run(rl_command(byte_model_dir, prompts, reward.format(dir=tmp_path), out), env=child_env(),
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.startswith("gpt2 rl: error: --reward") and message in done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert not out.exists()  # refused before anything was written
