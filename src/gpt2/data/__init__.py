"""Token data: the shard format and manifest, the batch loader, the prepare pipeline, built-in corpora."""

from gpt2.data.core import *  # noqa: F403
