"""The top level: scan -> plan -> shards (run by an engine) -> manifest.

`pack` plans once (`ensure_plan`), hands the shards not yet done to an engine, which runs
`packer.write.shard.run_shard` on each (`pack_shards`), and then `packer.run.publish` writes `index.json`
once every planned shard has its marker (`merge` after tasks, imported here as `pipeline.merge`).
A rerun of the same command resumes: finished shards are kept. `packer.run.append` builds on
`pack_shards` and `run_summary` for `pack --append`.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from readers.cpus import available_cpus
from readers.formats import ALIASES, FORMATS
from readers.manifest import MANIFEST_NAME, REJECTS_NAME, Manifest, parse_manifest

from ..plan.changes import plan_differences, run_changes, source_changes
from .descriptors import DEFAULT_SPLIT
from ..engines import get_engine
from ..errors import FinishedOutput, PackError
from ..stores.fsutil import release_freed_memory
from ..stores.output import Output, opened_output
from ..plan.partition import Partition, resolve_partition
from ..plan.options import PackOptions
from ..plan.plan import Plan, write_plan
from ..plan.scan import scan_source
from .publish import merge, publish
from ..write.shard import Progress, ShardResult, check_rejects, clean_tmp, finished_shards
from ..sources.inputs import Source, resolve_source
from ..write.validate import ErrorPolicy

log = logging.getLogger(__name__)



@dataclass
class Summary:
    out: str
    num_samples: int
    bytes: int
    source_bytes: int
    num_shards: int
    planned_shards: int
    rejects: int
    ignored: int
    ignored_names: list[str]  # the first of them
    resumed_shards: int
    elapsed: float
    published: bool
    up_to_date: bool = False  # OUT already held this dataset, packed from the same SRC and options: nothing done
    dataset: tuple[int, int, int] | None = None  # an append (packer.run.append): OUT's samples, shards, classes now
    unclassed: int = 0  # images beside the class folders, in no class: left out
    unclassed_names: list[str] = field(default_factory=list)  # the first of them
    aliases: list[str] = field(default_factory=list)  # class folders aliased inside another, packed once

    @property
    def files_per_second(self) -> float:
        return (self.num_samples + self.rejects) / self.elapsed if self.elapsed > 0 else 0.0


@dataclass(frozen=True)
class RunOptions:
    """How a run goes, as opposed to what it packs (PackOptions): not recorded in the plan. The one
    run context the CLI and the Python API hand to the pipeline (`pack_run`)."""

    workers: int | None = None
    overwrite: bool = False
    append: bool = False  # add SRC's samples to the dataset in OUT as new shards (`packer.run.append.append_run`)
    append_again: bool = False  # append samples OUT holds already, from another path (a copy, a symlink)
    task_index: int | None = None
    task_count: int | None = None
    engine: str = "local"
    scheduler: str | None = None
    on_error: str = "skip"
    max_errors: int | None = None
    split: str = DEFAULT_SPLIT
    staging: str | os.PathLike[str] | None = None  # a URL OUT: where shards are written before upload
    storage_options: dict[str, Any] | None = None  # a URL OUT: fsspec's options (endpoint, credentials)
    # An append's store options as given (`--store` among them only if given), which PackOptions
    # cannot tell from its defaults; None: those of PackOptions that differ from the defaults.
    given_encoding: dict[str, Any] | None = None

    @property
    def policy(self) -> ErrorPolicy:
        return ErrorPolicy(on_error=self.on_error, max_errors=self.max_errors)

    def partition(self) -> Partition:
        """This task's share: the flags, else the environment (`packer.plan.partition.resolve_partition`)."""
        return resolve_partition(self.task_index, self.task_count)

    def check(self, out: object, partition: Partition) -> None:
        """Refuse what a partitioned run (or an append) cannot do, before anything is written."""
        if self.append_again and not self.append:
            raise PackError(f"{out}: --append-again goes with --append")
        if self.append and self.overwrite:
            raise PackError(f"{out}: --append adds to OUT and --overwrite replaces it; choose one")
        if self.engine != "local" and not partition.is_whole:
            raise PackError(f"--engine {self.engine} runs every shard itself; drop --task-index/--task-count")
        if self.overwrite and not partition.is_whole:
            raise PackError(f"{out}: --overwrite cannot be combined with a partitioned run; remove OUT first")


def pack(
    src: str | os.PathLike[str],
    out: str | os.PathLike[str],
    options: PackOptions,
    *,
    overwrite: bool = False,
    workers: int | None = None,
    partition: Partition = Partition(),
    engine: str = "local",
    scheduler: str | None = None,
    progress: Progress | None = None,
    planned: Callable[[int], None] | None = None,
    policy: ErrorPolicy = ErrorPolicy(),
    split: str = DEFAULT_SPLIT,
    staging: str | os.PathLike[str] | None = None,
    storage_options: dict[str, Any] | None = None,
) -> Summary:
    """`pack_run` with the partition and error policy given as objects (for library callers that
    hold them already): the RunOptions they make."""
    run = RunOptions(workers=workers, overwrite=overwrite, task_index=partition.index, task_count=partition.count,
                     engine=engine, scheduler=scheduler, on_error=policy.on_error, max_errors=policy.max_errors,
                     split=split, staging=staging, storage_options=storage_options)
    return pack_run(src, out, options, run, progress=progress, planned=planned)


def pack_run(src: str | os.PathLike[str] | Source, out: str | os.PathLike[str], options: PackOptions,
             run: RunOptions, *, progress: Progress | None = None,
             planned: Callable[[int], None] | None = None) -> Summary:
    """Pack the images under `src` into shards in `out`. SRC becomes a Source here, once
    (`packer.sources.inputs.resolve_source`), and that value is what the run hands down.

    With a partition of several tasks, only this task's shards are packed and nothing is
    published: `merge` does that once all tasks are done. An interrupted run of the same
    command resumes: finished shards are kept, the others are packed again. The run's error
    policy says whether a rejected file stops the run, and how many rejects are too many; its
    `split` names the split in the loader descriptors written at publish. `planned(n)` is called
    once the plan exists, with the samples this run will have done (resumed ones included),
    before any `progress`.

    Rerunning a finished pack (index.json there) with the same SRC and options does nothing and
    returns a Summary that says so (`up_to_date`): a requeued batch job must not fail.

    `out` may be a URL (`s3://bucket/x.wds`, any writable fsspec URL): shards are then written in
    `run.staging` (default: a temporary folder) and uploaded one by one, `index.json` last;
    `run.storage_options` go to fsspec (endpoint, credentials).
    """
    source = src if isinstance(src, Source) else resolve_source(src, options.input_format)
    with opened_output(out, staging=run.staging, storage_options=run.storage_options) as target:
        started = time.monotonic()
        partition = run.partition()
        run.check(target, partition)
        if run.append:
            raise PackError(f"{target}: pack_run packs; an append goes through packer.run.append.append_run "
                            "(or api.run)")
        try:
            plan = ensure_plan(source, target, options, overwrite=run.overwrite, partition=partition)
        except FinishedOutput as finished:
            return up_to_date_summary(source, target, options, finished, started)
        final, resumed = pack_shards(target, plan, run, partition, progress=progress, planned=planned)
        published = partition.is_whole
        if published:
            publish(target, run.policy, run.split, plan, final)
        return run_summary(target, plan, final, resumed, started, published)


def pack_shards(out: Output, plan: Plan, run: RunOptions, partition: Partition, *, progress: Progress | None,
                planned: Callable[[int], None] | None) -> tuple[dict[int, ShardResult | None], int]:
    """Have the engine pack this task's shards of `plan` that are not done yet (a pack's or an
    append's); returns every one of them with its marker (None: unfinished) and how many were
    done before."""
    if run.policy.on_error == "fail":
        check_rejects(out, plan, plan.scan_rejects, run.policy)
    mine = partition.shards(plan.num_shards)
    fresh = out.fresh  # no marker there yet: spare the store's round trips
    done: dict[int, ShardResult | None] = dict.fromkeys(mine) if fresh else finished_shards(out, plan, mine)
    pending = [shard for shard, result in done.items() if result is None]
    if planned:
        planned(sum(plan.bounds[k + 1] - plan.bounds[k] for k in mine))
    if progress:
        progress(sum(plan.bounds[k + 1] - plan.bounds[k] for k, result in done.items() if result is not None))
    clean_tmp(out, plan, pending)
    release_freed_memory()
    get_engine(run.engine)(out, plan, pending, workers=run.workers or available_cpus(), scheduler=run.scheduler,
                           progress=progress, policy=run.policy)
    return finished_shards(out, plan, mine, check_hash=False), len(mine) - len(pending)


def run_summary(out: Output, plan: Plan, final: dict[int, ShardResult | None], resumed: int, started: float,
                published: bool, dataset: Manifest | None = None) -> Summary:
    """What a run of `plan` did (`pack_shards`'s results); `dataset`: OUT's manifest after an append."""
    finished = [result for result in final.values() if result is not None]
    return Summary(
        out=str(out),
        num_samples=sum(result.num_samples for result in finished),
        bytes=sum(result.bytes for result in finished),
        source_bytes=sum(result.source_bytes for result in finished),
        num_shards=sum(1 for result in finished if result.written),
        planned_shards=plan.num_shards,
        rejects=sum(len(result.rejects) for result in finished) + (len(plan.scan_rejects) if published else 0),
        ignored=plan.ignored,
        ignored_names=plan.ignored_names,
        resumed_shards=resumed,
        elapsed=time.monotonic() - started,
        published=published,
        dataset=(dataset.num_samples, len(dataset.shards), len(dataset.classes)) if dataset else None,
        unclassed=plan.unclassed,
        unclassed_names=plan.unclassed_names,
        aliases=plan.aliases,
    )


def up_to_date_summary(source: Source, out: Output, options: PackOptions, finished: FinishedOutput,
                       started: float) -> Summary:
    """The Summary of a dataset OUT already holds, when its plan has this SRC and these options;
    otherwise `finished` (no plan: who knows what made it), or an error naming what differs."""
    plan = out.stored_plan()
    if plan is None:
        raise finished
    options = canonical_options(options)
    differences = plan_differences(plan, source, options)
    if differences:
        raise PackError(f"{out}: already holds a packed dataset of {differences}; pass --overwrite to replace it")
    changes = source_changes(source, out, plan, options)
    if changes:
        raise PackError(changes.describe(source.named, out, changes.pack_way_on(published=True)))
    manifest = parse_manifest((out.read_text(MANIFEST_NAME) or "").encode(), out / MANIFEST_NAME)
    rejects = out.read_text(REJECTS_NAME) or ""
    log.info("%s: up to date (packed from %s with the same options)", out, plan.source)
    return Summary(
        out=str(out), num_samples=manifest.num_samples, bytes=sum(shard.bytes for shard in manifest.shards),
        source_bytes=manifest.source_bytes or 0, num_shards=len(manifest.shards), planned_shards=plan.num_shards,
        rejects=len(rejects.splitlines()), ignored=plan.ignored, ignored_names=plan.ignored_names,
        unclassed=plan.unclassed, unclassed_names=plan.unclassed_names, aliases=plan.aliases,
        resumed_shards=len(manifest.shards),
        elapsed=time.monotonic() - started, published=True, up_to_date=True,
    )


def canonical_options(options: PackOptions) -> PackOptions:
    """Options naming the format by its registry name, so an alias never reaches the manifest."""
    name = ALIASES.get(options.format, options.format)
    if name not in FORMATS:
        raise PackError(f"unknown format {options.format!r} (choose from {', '.join(FORMATS)})")
    return replace(options, format=name)


def ensure_plan(src: str | os.PathLike[str] | Source, out: str | os.PathLike[str] | Output, options: PackOptions, *,
                overwrite: bool = False, partition: Partition = Partition()) -> Plan:
    """The plan in OUT, written once: the first process scans SRC, the others (and reruns) reuse it.
    `src` is `pack_run`'s Source, or for `pack plan` (the entry then) SRC as given.

    The output serialises concurrent tasks where it can (a local folder's file lock), so N tasks
    do not all walk millions of files, and a bucket's tasks agree by writing the same plan
    (`RemoteOut.publish_plan`); a plan made with other options is an error, never silently replaced.
    """
    options = canonical_options(options)
    source = src if isinstance(src, Source) else resolve_source(src, options.input_format)
    with opened_output(out) as target, target.planning(source, overwrite=overwrite):
        plan = target.stored_plan()
        if plan is not None:
            return reuse_plan(plan, source, target, options, partition)
        return target.publish_plan(write_plan(target.staging, scan_source(source, options), options, source=source))


def reuse_plan(plan: Plan, source: Source, out: Output, options: PackOptions, partition: Partition) -> Plan:
    """OUT's `plan`, for a rerun or a task of `partition`, when it is this SRC's and these options',
    and SRC has not changed since (`changes.run_changes`)."""
    differences = plan_differences(plan, source, options)
    if differences:
        raise PackError(f"{out}: holds an unfinished run of {differences}; rerun with those, or pass --overwrite "
                        "to start over")
    changes = run_changes(source, out, plan, options, partition)
    if changes:
        raise PackError(changes.describe(source.location, out, changes.pack_way_on(published=False)))
    log.info("%s: reusing the plan (%d shards)", out, plan.num_shards)
    return plan

