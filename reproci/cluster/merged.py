"""``reproci merge``'s document (schema reproci.merged): the shards of a CI matrix in one verdict
(``cluster.merge_shards``), its models the shards' entries with their image."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypedDict

from ..results import Image, ModelEntry, RecordedOptions, Summary


@dataclass(frozen=True, kw_only=True)
class Header:
    """What a merged file says of its format, read before the rest of it is trusted."""

    schema: str | None = None
    version: int | None = None


class MergedModel(ModelEntry, total=False):
    """A model of a merged document (``reproci merge``, schema reproci.merged): its entry's verdict,
    evidence and warnings, with its shard's image and CI mode."""

    image: str  # not the document's Image: the shard's image name
    ci: bool


class ShardEnvironment(TypedDict):
    torch: str | None
    cuda: str | None
    cudnn: str | None
    nccl: str | None
    gpu_names: list[str]
    gpu_count: int | None
    driver: str | None
    device: str | None
    threads: Any  # as the environment fingerprint records them


class Shard(TypedDict):
    """One shard of a merged document: what identifies its run, and its exit code."""

    image: Image
    run_id: str | None
    created: str | None
    source: str  # its results.json
    project_commit: str | None
    reproci_version: str | None
    options: RecordedOptions | None
    environment: ShardEnvironment
    summary: Summary | None
    exit_code: int


class MergedSummary(TypedDict):
    verdicts: dict[str, int]
    images: int
    recorded: int  # models whose golden the shards recorded
    models: int
    missing: int
    exit_code: int


class MergedDocument(TypedDict):
    """``reproci merge``'s document: every shard of a CI matrix in one verdict (cluster.merge_shards)."""

    schema: str
    version: int
    created: str
    reproci_version: str
    shards: list[Shard]
    missing: list[str]  # images (and cells) the matrix expected that never arrived
    models: list[MergedModel]
    summary: MergedSummary
