"""Names the doctests of src/gpt2 may use, so that their examples run instead of being skipped. (This file sits
at the repository root, not in src/: a second `conftest` module collected later would shadow tests/conftest.py,
whose helpers the tests import by that name.)

- `gpt2_files`: a folder with OpenAI's GPT-2 `encoder.json` and `vocab.bpe` (the shared data; as in the tests,
  a doctest that needs it is skipped where it is missing, and fails under CI).
- `tmp`: an empty folder of the doctest's own, for examples that write files (never the working directory).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

SHARED_DATA = Path(os.environ.get("GPT2_SHARED_DATA", Path(__file__).resolve().parents[1] / "shared" / "data"))


@pytest.fixture(autouse=True)
def _doctest_names(request: pytest.FixtureRequest, tmp_path: Path) -> None:
    if not isinstance(request.node, pytest.DoctestItem):
        return
    gpt2_files = SHARED_DATA / "gpt2-bpe"
    source = "".join(example.source for example in request.node.dtest.examples)
    if "gpt2_files" in source and not (gpt2_files / "vocab.bpe").exists():
        message = f"{gpt2_files} is missing (set GPT2_SHARED_DATA to the shared/data folder)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)
    namespace = request.getfixturevalue("doctest_namespace")
    namespace.update(gpt2_files=gpt2_files, tmp=tmp_path)
