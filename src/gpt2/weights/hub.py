"""The one place that reaches the network: resolving a Hugging Face Hub name to a local directory.

Everything else in the package works on local paths. A name that is a local directory is returned as is;
anything else is fetched with `huggingface_hub` (an optional dependency) or refused with a clear error.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence


def resolve_pretrained(name_or_path: str | Path, allow_patterns: Sequence[str]) -> Path:
    """Return a local directory for `name_or_path`, downloading `allow_patterns` from the Hub if needed.

    Raises FileNotFoundError naming the path and the way out when it is neither a local directory nor
    downloadable (offline, huggingface_hub missing, unknown repo).
    """
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return path
    if path.exists():
        raise FileNotFoundError(f"{str(path)!r} is a file; expected a directory holding the model/tokenizer files")
    name = str(name_or_path)
    if name.startswith((".", "/", "~")) or name.count("/") > 1:
        raise FileNotFoundError(f"directory {name!r} does not exist")
    try:
        from huggingface_hub import snapshot_download
    except ImportError as err:
        raise FileNotFoundError(
            f"{name!r} is not a local directory, and huggingface_hub is not installed to fetch it from the Hub; "
            "pass a local directory or `pip install huggingface_hub`"
        ) from err
    try:
        return Path(snapshot_download(repo_id=name, allow_patterns=list(allow_patterns)))
    except Exception as err:  # offline, unknown repo, gated repo...: all end the same way for the caller
        raise FileNotFoundError(
            f"{name!r} is not a local directory and could not be fetched from the Hugging Face Hub "
            f"({type(err).__name__}: {str(err).splitlines()[0] if str(err) else 'no details'}); "
            "check the name and the network, or pass a local directory"
        ) from err
