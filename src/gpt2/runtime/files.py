"""Writing files so that a crash never leaves half of one: write a temporary file beside it, then rename.

Temporaries are named `.NAME.HOST-PID.RANDOM.tmp` after the path they become and the process writing them, so a
write killed before its rename (kill -9, a power cut) leaves one the next write to that path recognises as its
own and removes, once its writer is gone; a live writer's is never touched.

A disk that refuses a write (full, read-only, not ours) raises an OSError whose `filename` is the path being
written, never a temporary's; `describe_write_error` turns it into the one line the command line prints.
"""

from __future__ import annotations

import errno
import json
import os
import re
import secrets
import shutil
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

# errno -> (what the disk said, what to do about it), for the OS errors a writer meets on a disk that refuses
_WRITE_FAILURES = {
    errno.ENOSPC: ("no space left on the device", "free some space there or write to another disk"),
    errno.EDQUOT: ("disk quota exceeded", "free some space within your quota or write to another disk"),
    errno.EROFS: ("the filesystem is read-only", "write to a folder on a writable disk"),
    errno.EACCES: ("permission denied", "write to a folder you own, or change its permissions"),
    errno.EPERM: ("operation not permitted", "write to a folder you own, or change its permissions"),
}
# A write that fails with less free space than this beside it is taken as a full disk: some writers (numpy's
# tofile, torch.save) lose the errno and say only "N requested and M written" or "unexpected pos".
_FULL_DISK_BYTES = 1 << 20


def describe_write_error(err: BaseException) -> str | None:
    """One line naming the path, the cause and the fix for an OS error a disk gives a writer (no space, quota,
    read-only, permission); None for any other error.

    >>> describe_write_error(OSError(errno.EROFS, "Read-only file system", "/mnt/out/model.gguf"))
    'cannot write /mnt/out/model.gguf: the filesystem is read-only; write to a folder on a writable disk'
    """
    if not isinstance(err, OSError) or err.errno not in _WRITE_FAILURES:
        return None
    cause, fix = _WRITE_FAILURES[err.errno]
    where = f" {err.filename}" if err.filename else ""
    return f"cannot write{where}: {cause}; {fix}"


def write_failure(err: BaseException, path: str | os.PathLike[str]) -> BaseException:
    """The error to raise for `err`, met writing `path`: a disk's refusal (see `describe_write_error`) as an
    OSError naming `path`, a write that lost its errno on a full disk as ENOSPC; any other error as it is."""
    code = err.errno if isinstance(err, OSError) else None
    if code is None and isinstance(err, (OSError, RuntimeError)):
        try:
            if shutil.disk_usage(Path(path).parent).free < _FULL_DISK_BYTES:
                code = errno.ENOSPC
        except OSError:
            pass
    if code not in _WRITE_FAILURES:
        return err
    named = getattr(err, "filename", None)
    if named and not any(part.startswith(".") and part.endswith(".tmp") for part in Path(os.fsdecode(named)).parts):
        path = named  # a file the writer opened inside `path` names the failure better; a temporary's name does not
    failure = OSError(code, os.strerror(code), os.fsdecode(path))
    failure.__cause__ = err
    return failure


@contextmanager
def disk_errors_named(path: str | os.PathLike[str]) -> Iterator[None]:
    """Re-raise a disk's refusal met inside the block as `write_failure(err, path)`: an OSError naming `path`."""
    try:
        yield
    except (OSError, RuntimeError) as err:
        failure = write_failure(err, path)
        if failure is err:
            raise
        raise failure from err


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", socket.gethostname()) or "host"


def temporary_path(path: Path) -> Path:
    """A new name beside `path` for what will become it: `.NAME.HOST-PID.RANDOM.tmp`."""
    return path.parent / f".{path.name}.{_host()}-{os.getpid()}.{secrets.token_hex(4)}.tmp"


def _writer_is_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return True
    except PermissionError:  # exists, under another user
        return False
    return False


def remove_stale_temporaries(path: Path) -> list[Path]:
    """Remove the temporaries that earlier writes to `path` left behind, where their writer ran on this host and
    is no longer running (files or folders). Returns what was removed."""
    pattern = re.compile(rf"\.{re.escape(path.name)}\.(?P<host>\w+)-(?P<pid>\d+)\.[0-9a-f]+\.tmp")
    removed: list[Path] = []
    if not path.parent.is_dir():
        return removed
    for candidate in path.parent.iterdir():
        match = pattern.fullmatch(candidate.name)
        if match and match["host"] == _host() and _writer_is_gone(int(match["pid"])):
            if candidate.is_dir() and not candidate.is_symlink():
                shutil.rmtree(candidate, ignore_errors=True)
            else:
                candidate.unlink(missing_ok=True)
            removed.append(candidate)
    return removed


@contextmanager
def atomic_output(path: str | os.PathLike[str]) -> Iterator[Path]:
    """A temporary path beside `path` to write to; synced and renamed onto `path` only when the block finishes,
    so a crash or an error never leaves half a file under the real name. The file gets the permissions an
    ordinary `open(path, "w")` would (0o666 less the umask), not the private 0o600 it is written with."""
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{path} is a directory; give the path of the file to write, e.g. {path / 'out.bin'}")
    with disk_errors_named(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_temporaries(path)
        temporary = temporary_path(path)
        os.close(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    try:
        yield Path(temporary)
        with open(temporary, "rb+") as file:
            os.fsync(file.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(temporary, 0o666 & ~umask)
        os.replace(temporary, path)
    except BaseException as err:
        failure = write_failure(err, path)  # judged before the unlink frees the space
        temporary.unlink(missing_ok=True)
        if failure is err:
            raise
        raise failure from err


@contextmanager
def atomic_directory(path: str | os.PathLike[str]) -> Iterator[Path]:
    """A temporary folder beside `path` to fill; when the block finishes, a new directory appears at `path` complete,
    or, into an existing directory, each top-level item is moved in whole. An error leaves `path` as it was."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise NotADirectoryError(f"{path} is a file; give the path of a directory to write into")
    with disk_errors_named(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_temporaries(path)
        staging = temporary_path(path)
        staging.mkdir(mode=0o700)
    try:
        yield staging
        if not path.exists():
            umask = os.umask(0)
            os.umask(umask)
            staging.chmod(0o777 & ~umask)  # private while it was being filled
            os.replace(staging, path)
            return
        for item in sorted(staging.iterdir()):
            target = path / item.name
            if item.is_dir() and target.is_dir():
                shutil.rmtree(target)  # a folder is replaced as a whole, never merged with an older one
            os.replace(item, target)
    except BaseException as err:
        failure = write_failure(err, path)  # judged before the rmtree frees the space
        shutil.rmtree(staging, ignore_errors=True)
        if failure is err:
            raise
        raise failure from err
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write `data` to `path` through `atomic_output`."""
    with atomic_output(path) as temporary:
        temporary.write_bytes(data)


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """`atomic_write_bytes` for UTF-8 text (newlines written as given)."""
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_copy_file(source: str | os.PathLike[str], path: str | os.PathLike[str]) -> None:
    """Copy `source` to `path` through `atomic_output`."""
    with atomic_output(path) as temporary:
        shutil.copyfile(source, temporary)


def read_utf8_text(path: str | os.PathLike[str]) -> str:
    """The text of a UTF-8 file; a byte that is not UTF-8 is a ValueError naming file:line."""
    data = Path(path).read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise ValueError(
            f"{path}:{line}: not UTF-8 text ({err.reason}, byte 0x{data[err.start]:02x}); save the file as UTF-8"
        ) from None


def iter_jsonl_objects(path: str | os.PathLike[str]) -> Iterator[tuple[str, dict[str, Any]]]:
    """("file:line", record) for each non-blank line of a JSONL file; a line that is not a JSON object is a
    ValueError naming file:line."""
    with open(path, encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{where}: not valid JSON ({err.msg}); each line must be one JSON object") from None
            if not isinstance(record, dict):
                raise ValueError(f"{where}: expected a JSON object, got {type(record).__name__}")
            yield where, record
