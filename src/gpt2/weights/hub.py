"""The one place that reaches the network: resolving a Hugging Face Hub name to a local directory.

Everything else in the package works on local paths. A name that is a local directory is returned as is;
anything else is fetched with `huggingface_hub` (an optional dependency) or refused with a clear error.
`download_file` fetches one file by URL (the public evaluation files), checked by sha256 and written atomically.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path

from gpt2.runtime.files import atomic_write_bytes


def resolve_pretrained(name_or_path: str | os.PathLike[str], allow_patterns: Sequence[str]) -> Path:
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


def resolve_subfolder(name: str, files: Sequence[str]) -> Path:
    """The local copy of a folder inside a Hub repository, "owner/repo/path/in/repo" (SAELens' SAE releases keep
    one SAE per folder), downloading just `files` of it. FileNotFoundError as `resolve_pretrained`."""
    parts = name.strip("/").split("/")
    if len(parts) < 3 or name.startswith((".", "/", "~")):
        raise FileNotFoundError(f"{name!r} is not a local directory, nor a Hub folder named as owner/repo/folder")
    repo, folder = "/".join(parts[:2]), "/".join(parts[2:])
    return resolve_pretrained(repo, [f"{folder}/{file}" for file in files]) / folder


DOWNLOAD_TIMEOUT_S = 60  # per blocking network operation, not for the whole file


def download_file(url: str, destination: str | Path, *, sha256: str | None = None) -> Path:
    """Download `url` to `destination` (parent folders created) and return that path.

    The file appears whole or not at all (written to a temporary file, then renamed). With `sha256`, the
    bytes are checked first and a mismatch is a ValueError that leaves nothing behind. Offline or on an HTTP
    error, raises FileNotFoundError naming the URL, the reason and where to put the file by hand.
    """
    destination = Path(destination)
    try:
        with urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT_S) as response:
            data = response.read()
    except (OSError, http.client.HTTPException) as err:  # URLError, HTTPError and timeouts are OSErrors
        raise FileNotFoundError(
            f"downloading {url} failed ({err}); check the network, or download it by hand to {str(destination)!r}"
        ) from err
    digest = hashlib.sha256(data).hexdigest()
    if sha256 is not None and digest != sha256.lower():
        raise ValueError(f"{url} has sha256 {digest}, expected {sha256}; the download is corrupt, try again")
    destination.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(destination, data)
    return destination


def iter_hf_dataset(
    name: str, *, split: str = "train", config: str | None = None, text_field: str = "text"
) -> Iterator[str]:
    """The documents (`text_field` of each record) of a Hugging Face dataset, streamed (needs `datasets`, online).

    The only place data preparation reaches the network (`gpt2.data.prepare(..., dataset=NAME)` calls it); a
    generator, so nothing is fetched, and no error raised, before the first document is asked for.
    """
    try:
        import datasets  # optional dependency: pip install 'gpt2-faithful[datasets]'
    except ImportError as err:
        raise ValueError(
            f"reading the Hugging Face dataset {name!r} needs the `datasets` library, which is not installed; "
            "`pip install 'gpt2-faithful[datasets]'`, or download the data and pass local files"
        ) from err
    try:
        records = datasets.load_dataset(name, config, split=split, streaming=True)
    except Exception as err:  # offline, unknown name, missing config: all end the same way for the caller
        first_line = str(err).splitlines()[0] if str(err) else "no details"
        raise ValueError(
            f"could not load Hugging Face dataset {name!r} (config {config!r}, split {split!r}): "
            f"{type(err).__name__}: {first_line}; check the name, config, split and the network"
        ) from err
    for index, record in enumerate(records):
        if text_field not in record:
            raise ValueError(
                f"record {index} of dataset {name!r} has no field {text_field!r} (fields: {', '.join(record)}); "
                "choose the text field with --jsonl-field NAME"
            )
        yield str(record[text_field])
