"""`gpt2 bench`: one benchmark tool over a parameter grid, with repetitions, peers measured in the same run, and one
record schema (record.py) written as JSON lines or a markdown table, and one loop that warms up and alternates ours
with its peers (timing.py). One module per area: decode.py (decode and prefill; bandwidth.py gives its weight GB/s
beside the machine's read bandwidth), serve.py, train.py, tokenizer.py, evaluate.py, finetune.py; profile.py is
the prepared GPU profile. docs/performance.md's figures come from it, each row with its command."""

from gpt2.bench.record import Environment, Record, Recorder, markdown_table
from gpt2.bench.setup import BenchSettings

__all__ = ["BenchSettings", "Environment", "Record", "Recorder", "markdown_table"]
