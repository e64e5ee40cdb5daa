"""The training config: `section.field` keys in TOML tables and `--set`, the flat keys as aliases with one notice,
every type and bound checked with one line per problem naming the key, presets, round trips."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import gpt2
from gpt2.cli import main as cli_main
from gpt2.train.config import ALIASES, KEYS, PRESETS, SECTIONS, ConfigError, TrainConfig, load_config, parse_overrides

# Every bounded setting, a value past each of its bounds, and the range the error names. A bound added to a
# section without a line here fails test_the_bound_table_covers_every_bounded_setting.
BOUNDS = [
    ("data.vocab_size", 0, "an integer in [1, 2**63)"),
    ("data.vocab_size", 2**63, "an integer in [1, 2**63)"),
    ("data.max_corpus_bytes", 0, "an integer in [1, 2**63) or none"),
    ("data.val_fraction", -0.1, "a number in [0.0, 1.0)"),
    ("data.val_fraction", 1.0, "a number in [0.0, 1.0)"),
    ("data.batch_size", 0, "an integer in [1, 2**63)"),
    ("data.grad_accum_steps", 0, "an integer in [1, 2**63)"),
    ("data.total_batch_tokens", 0, "an integer in [1, 2**63) or none"),
    ("model.n_layer", 0, "an integer in [1, 2**63) or none"),
    ("model.n_head", 0, "an integer in [1, 2**63) or none"),
    ("model.n_embd", 0, "an integer in [1, 2**63) or none"),
    ("model.block_size", 0, "an integer in [1, 2**63) or none"),
    ("model.dropout", -0.5, "a number in [0.0, 1.0) or none"),
    ("model.dropout", 1.0, "a number in [0.0, 1.0) or none"),
    ("optimizer.learning_rate", 0.0, "a number > 0.0"),
    ("optimizer.weight_decay", -1e-3, "a number >= 0.0"),
    ("optimizer.beta1", -0.1, "a number in [0.0, 1.0)"),
    ("optimizer.beta1", 1.0, "a number in [0.0, 1.0)"),
    ("optimizer.beta2", 1.0, "a number in [0.0, 1.0)"),
    ("optimizer.eps", 0.0, "a number > 0.0"),
    ("optimizer.grad_clip", -1.0, "a number >= 0.0"),
    ("optimizer.muon_lr", 0.0, "a number > 0.0"),
    ("optimizer.muon_momentum", 1.0, "a number in [0.0, 1.0)"),
    ("optimizer.muon_momentum_warmup_steps", -1, "an integer in [0, 2**63)"),
    ("optimizer.muon_weight_decay", -0.1, "a number >= 0.0"),
    ("optimizer.muon_ns_steps", 0, "an integer in [1, 20]"),
    ("optimizer.muon_ns_steps", 21, "an integer in [1, 20]"),
    ("schedule.max_steps", 0, "an integer in [1, 2**63)"),
    ("schedule.warmup_steps", -1, "an integer in [0, 2**63)"),
    ("schedule.min_lr_ratio", -0.1, "a number in [0.0, 1.0]"),
    ("schedule.min_lr_ratio", 1.5, "a number in [0.0, 1.0]"),
    ("schedule.decay_fraction", 0.0, "a number in (0.0, 1.0]"),
    ("schedule.decay_fraction", 1.01, "a number in (0.0, 1.0]"),
    ("evaluation.eval_interval", -1, "an integer in [0, 2**63)"),
    ("evaluation.eval_batches", 0, "an integer in [1, 2**63)"),
    ("evaluation.hellaswag_limit", 0, "an integer in [1, 2**63) or none"),
    ("evaluation.sample_tokens", -1, "an integer in [0, 2**63)"),
    ("evaluation.sample_temperature", -0.5, "a number >= 0.0"),
    ("evaluation.sample_top_k", 0, "an integer in [1, 2**63) or none"),
    ("output.out_dir", "", "a non-empty string"),
    ("output.checkpoint_interval", -1, "an integer in [0, 2**63)"),
    ("output.keep_checkpoints", 0, "an integer in [1, 2**63)"),
    ("output.log_interval", 0, "an integer in [1, 2**63)"),
    ("runtime.seed", -1, "an integer in [0, 2**63)"),
    ("runtime.seed", 2**63, "an integer in [0, 2**63)"),
]


def problems(values: dict) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        TrainConfig.from_dict(values)
    assert str(caught.value).splitlines() == caught.value.problems  # one line per problem
    return caught.value.problems


@pytest.mark.parametrize(("key", "value", "accepted"), BOUNDS, ids=[f"{k}={v!r}"[:40] for k, v, _ in BOUNDS])
def test_every_bound_is_refused_in_one_line_naming_the_key_the_value_and_the_range(key, value, accepted):
    shown = repr(value)
    assert problems({key: value}) == [f"{key} = {shown}: must be {accepted}"]
    section, name = key.split(".")
    assert problems({section: {name: value}}) == [f"{key} = {shown}: must be {accepted}"]  # as a TOML table


def test_the_bound_table_covers_every_bounded_setting():
    bounded = {
        key
        for key, (section, name) in KEYS.items()
        if any(
            getattr(item, bound, None) is not None and getattr(item, bound) != 2**63
            for item in SECTIONS[section].__pydantic_fields__[name].metadata
            for bound in ("ge", "gt", "le", "lt", "min_length")
        )
    }
    assert bounded == {key for key, _, _ in BOUNDS}


def test_every_problem_is_reported_at_once_each_on_its_line():
    lines = problems({"schedule.max_steps": "ten", "runtime.seed": -1, "runtime.compile": "fast",
                      "schedule.lr_schedule": "linear", "output.log_to": ["wandb", "mlflow"],
                      "optimizer.learning_rate": float("nan"), "data.batch_size": 2.0,
                      "runtime.parallel": "tp"})  # fmt: skip
    assert lines == [  # in the order of the sections and their fields
        "data.batch_size = 2.0: must be an integer in [1, 2**63)",
        "optimizer.learning_rate = nan: must be a number > 0.0",
        "schedule.max_steps = 'ten': must be an integer in [1, 2**63)",
        "schedule.lr_schedule = 'linear': must be one of 'cosine', 'wsd'",
        "output.log_to[1] = 'mlflow': must be one of 'tensorboard', 'wandb'",
        "runtime.compile = 'fast': must be true or false",
        "runtime.parallel = 'tp': must be one of 'ddp', 'fsdp'",
        "runtime.seed = -1: must be an integer in [0, 2**63)",
    ]


def test_a_huge_value_is_cut_in_its_message():
    (line,) = problems({"schedule.max_steps": 10**400})
    assert line.startswith("schedule.max_steps = 1000000") and "(401 characters)" in line and len(line) < 120
    assert line.endswith("must be an integer in [1, 2**63)")
    (line,) = problems({"evaluation.sample_prompt": ["x" * 10_000]})
    assert len(line) < 120


def test_a_check_across_settings_names_them():
    assert problems({"model.n_embd": 100, "model.n_head": 3}) == [
        "model: n_embd (100) must be divisible by n_head (3): pick n_embd = n_head * head_dim"
    ]
    assert problems({"data.vocab_size": 100}) == [
        "data.vocab_size = 100: must be at least 257 with data.tokenizer = 'bpe' (256 bytes + <|endoftext|>)"
    ]
    assert TrainConfig.from_dict({"data.vocab_size": 100, "data.tokenizer": "bytes"}).data.vocab_size == 100
    (line,) = problems({"model.name": "gpt5"})
    assert line.startswith("model.name = 'gpt5': must be one of 'gpt2', ")


def test_an_unknown_key_is_named_with_the_nearest_spelling(tmp_path):
    assert problems({"schedule.max_step": 7, "learning_rat": 1e-3, "optimizer": {"nme": "muon"}}) == [
        "unknown training config key optimizer.nme; did you mean optimizer.name?",
        "unknown training config key schedule.max_step; did you mean schedule.max_steps?",
        "unknown training config key learning_rat; did you mean optimizer.learning_rate?",
    ]
    (line,) = problems({"schedule.zzzzzz": 1})
    assert line == (
        "unknown training config key schedule.zzzzzz; [schedule] has max_steps, warmup_steps, min_lr_ratio, "
        "lr_schedule, decay_fraction"
    )
    (line,) = problems({"zzzzzz": 1})
    assert line.endswith("a key is section.field, the sections: data, model, optimizer, schedule, evaluation, "
                         "output, runtime")  # fmt: skip
    with pytest.raises(ConfigError, match=r"^unknown training config key schedule.max_stepz; did you mean schedule"):
        load_config("stdlib", ["schedule.max_stepz=3"])
    toml = tmp_path / "run.toml"
    toml.write_text('preset = "stdlib"\n[schedule]\nmax_step = 10\n')
    with pytest.raises(ConfigError, match=r"^unknown training config key schedule.max_step; did you mean sc"):
        TrainConfig.from_toml(toml)
    with pytest.raises(ConfigError, match=r"^schedule = 5: must be a table of its settings"):
        TrainConfig.from_dict({"schedule": 5})


def test_toml_tables_and_set_section_field_give_the_same_config(tmp_path):
    toml = tmp_path / "run.toml"
    toml.write_text(
        'preset = "shakespeare-char"\n'
        '[optimizer]\nname = "adamw"\nlearning_rate = 3e-4\n'
        '[schedule]\nmax_steps = 50\nlr_schedule = "wsd"\n'
        '[evaluation]\nsample_top_k = 5\nsample_prompt = "def "\n'
        '[output]\nlog_to = ["wandb", "tensorboard"]\n'
        '[runtime]\ndevice = "cpu"\ncompile = true\n'
    )
    notices: list[str] = []
    from_file = load_config(toml, notice=notices.append)
    from_set = load_config("shakespeare-char", [
        "optimizer.name=adamw", "optimizer.learning_rate=3e-4", "schedule.max_steps=50", "schedule.lr_schedule=wsd",
        "evaluation.sample_top_k=5", 'evaluation.sample_prompt="def "', "output.log_to=wandb,tensorboard",
        "runtime.device=cpu", "runtime.compile=yes",
    ], notice=notices.append)  # fmt: skip
    assert from_file == from_set and notices == []
    assert (from_set.optimizer.name, from_set.schedule.max_steps, from_set.output.log_to) == (
        "adamw", 50, ("wandb", "tensorboard"))  # fmt: skip
    assert from_set.data.tokenizer == "bytes"  # the rest from the preset
    assert load_config(toml, ["schedule.max_steps=7", "evaluation.sample_top_k=none"], notice=notices.append) == (
        from_file.replace(**{"schedule.max_steps": 7, "evaluation.sample_top_k": None})
    )  # --set wins over the file


def test_a_flat_alias_is_read_as_its_key_with_one_notice(tmp_path):
    notices: list[str] = []
    config = load_config("stdlib", ["max_steps=7", "device=cpu", "optimizer=adamw", "schedule.warmup_steps=3"],
                         notice=notices.append)  # fmt: skip
    assert config == PRESETS["stdlib"].replace(
        schedule={"max_steps": 7, "warmup_steps": 3}, runtime={"device": "cpu"}, optimizer={"name": "adamw"}
    )
    assert notices == [
        "note: flat keys are aliases: max_steps is schedule.max_steps, device is runtime.device, "
        "optimizer is optimizer.name"
    ]
    toml = tmp_path / "run.toml"
    toml.write_text('preset = "stdlib"\nmax_steps = 9\n[optimizer]\nname = "adamw"\n')
    notices.clear()
    assert load_config(toml, ["seed=5"], notice=notices.append).runtime.seed == 5
    assert notices == ["note: flat keys are aliases: max_steps is schedule.max_steps, seed is runtime.seed"]


def test_the_alias_table_maps_every_setting_once():
    assert sorted(ALIASES.values()) == sorted(KEYS)
    renamed = {alias: key for alias, key in ALIASES.items() if key.split(".")[1] != alias}
    assert renamed == {"data": "data.source", "model": "model.name", "optimizer": "optimizer.name",
                       "optimizer_impl": "optimizer.impl"}  # fmt: skip


def test_a_setting_is_reached_by_its_key_its_section_or_its_flat_alias():
    flat = TrainConfig.from_dict({"optimizer": "muon", "muon_lr": 0.05, "max_steps": 7, "log_to": ["tensorboard"]})
    dotted = TrainConfig.from_dict(
        {"optimizer.name": "muon", "optimizer.muon_lr": 0.05, "schedule.max_steps": 7, "output.log_to": ["tensorboard"]}
    )
    nested = TrainConfig.from_dict(
        {
            "optimizer": {"name": "muon", "muon_lr": 0.05},
            "schedule": {"max_steps": 7},
            "output": {"log_to": ["tensorboard"]},
        }
    )
    assert flat == dotted == nested
    assert (flat.optimizer.name, flat.optimizer.muon_lr, flat.schedule.max_steps) == ("muon", 0.05, 7)
    assert flat.output.log_to == ("tensorboard",)
    assert TrainConfig.from_dict(flat.to_dict()) == TrainConfig.from_dict(flat.to_flat()) == flat


def test_set_values_read_as_their_settings_types():
    values = parse_overrides(TrainConfig, ["output.log_to=tensorboard,wandb", "evaluation.sample_prompt=123",
                                           "evaluation.sample_top_k=none", "runtime.compile=no", "model.dropout=0",
                                           'evaluation.sample_prompt="def "', "log_to=[\"wandb\"]"])  # fmt: skip
    assert values == {"output.log_to": ("tensorboard", "wandb"), "evaluation.sample_prompt": "def ",
                      "evaluation.sample_top_k": None, "runtime.compile": False, "model.dropout": 0,
                      "log_to": ("wandb",)}  # fmt: skip
    with pytest.raises(ConfigError, match=r"^schedule.max_steps = 'many': must be an integer in \[1, 2\*\*63\)$"):
        load_config("stdlib", ["schedule.max_steps=many"])


def test_config_round_trips_through_toml_and_json(tmp_path):
    for name, preset in PRESETS.items():
        path = tmp_path / f"{name}.toml"
        path.write_text(preset.to_toml())
        assert TrainConfig.from_toml(path) == preset
        assert TrainConfig.from_dict(json.loads(json.dumps(preset.to_dict()))) == preset  # train_config.json


def test_a_stored_train_config_of_sections_or_flat_keys_loads():
    # train_config.json as checkpoints hold it: nested sections, and the flat layout of older checkpoints
    sections = {"data": {"source": "stdlib", "tokenizer": "bytes", "vocab_size": 4096, "max_corpus_bytes": None,
                         "val_fraction": 0.1, "batch_size": 4, "grad_accum_steps": 1, "total_batch_tokens": None},
                "schedule": {"max_steps": 6}, "output": {"log_to": ["wandb"]}}  # fmt: skip
    flat = {"data": "stdlib", "tokenizer": "bytes", "batch_size": 4, "max_steps": 6, "log_to": ["wandb"]}
    assert TrainConfig.from_dict(sections) == TrainConfig.from_dict(flat)
    assert TrainConfig.from_dict(flat).output.log_to == ("wandb",)


def test_presets_and_defaults_keep_their_values():
    assert TrainConfig().schedule.max_steps == 1000 and TrainConfig().optimizer.learning_rate == 6e-4
    stdlib = PRESETS["stdlib"]
    assert (stdlib.optimizer.name, stdlib.optimizer.learning_rate, stdlib.model.n_embd) == ("muon", 4e-3, 128)
    assert stdlib.evaluation.sample_prompt == "def"
    with pytest.raises(ConfigError, match="unknown training preset 'nope'; choose one of: stdlib"):
        TrainConfig.from_name("nope")


def test_cli_reports_each_problem_in_one_line(capsys):
    assert cli_main(["train", "--set", "nope=1", "--set", "runtime.seed=-1", "--set", "schedule.max_steps=0",
                     "--print-config"]) == 2  # fmt: skip
    assert capsys.readouterr().err.splitlines() == [
        "gpt2 train: error: schedule.max_steps = 0: must be an integer in [1, 2**63)",
        "gpt2 train: error: runtime.seed = -1: must be an integer in [0, 2**63)",
        "gpt2 train: error: unknown training config key nope; a key is section.field, the sections: data, model, "
        "optimizer, schedule, evaluation, output, runtime",
    ]


def test_cli_notes_a_flat_alias_once_and_prints_the_config(capsys):
    assert cli_main(["train", "--set", "max_steps=3", "--set", "runtime.device=cpu", "--print-config"]) == 0
    out, err = capsys.readouterr()
    assert err == "gpt2 train: note: flat keys are aliases: max_steps is schedule.max_steps\n"
    assert "[schedule]\nmax_steps = 3\n" in out
    assert cli_main(["train", "--set", "schedule.max_steps=3", "--out", "runs/x", "--print-config"]) == 0
    out, err = capsys.readouterr()
    assert err == "" and 'out_dir = "runs/x"' in out


@pytest.mark.slow
def test_a_bad_config_through_the_command_shows_no_traceback(tmp_path):
    toml = tmp_path / "run.toml"
    toml.write_text("[schedule]\nmax_steps = -3\nwarmup = 1\n[runtime]\nseed = 1e999\n")
    env = {**os.environ, "PYTHONPATH": str(Path(gpt2.__file__).parents[1])}  # this checkout's package
    done = subprocess.run(
        [sys.executable, "-m", "gpt2.cli", "train", str(toml), "--set", "optimizer.nme=muon", "--print-config"],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.splitlines() == [  # the file's problems and --set's, at once
        "gpt2 train: error: unknown training config key optimizer.nme; did you mean optimizer.name?",
        "gpt2 train: error: schedule.max_steps = -3: must be an integer in [1, 2**63)",
        "gpt2 train: error: unknown training config key schedule.warmup; did you mean schedule.warmup_steps?",
        "gpt2 train: error: runtime.seed = inf: must be an integer in [0, 2**63)",
    ]
    assert "Traceback" not in done.stderr and "pydantic" not in done.stderr


def test_the_docs_table_lists_every_key_with_its_alias():
    text = (Path(__file__).resolve().parents[1] / "docs" / "training.md").read_text(encoding="utf-8")
    section = text.split("## The training config: keys, files, aliases", 1)[1].split("\n## ", 1)[0]
    rows = [line.strip("|").split("|") for line in section.splitlines() if line.startswith("| `")]
    assert {row[0].strip(" `"): row[1].strip(" `") for row in rows} == {key: alias for alias, key in ALIASES.items()}
