"""The operator's commands: ``warmwatch verify`` and ``warmwatch inspect`` (docs/design.md §8).

Both read the database read-only (``mode=ro``), beside a running warmwatch or a stopped one.
``verify`` also talks to the apiserver, with the same connection code and the same
``--kubeconfig`` / ``--context`` (and ``WARMWATCH_*`` variables) as the proxy itself.

Exit status: 0 when everything compared is equal (verify) or was read (inspect); 1 when
verify found differences; 2 when something could not be read or compared at all.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import sqlite3
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

import orjson

from proxy.cache.inspecting import (
    DatabaseFiles,
    InspectError,
    ShapeContents,
    StoredShape,
    database_files,
    open_read_only,
    shape_contents,
    stored_shapes,
)
from proxy.cache.verifying import Difference, OutOfOrder
from proxy.environment import env
from proxy.kube.resources import ResourceFlag
from proxy.metrics import Metrics
from proxy.upstream.comparing import ShapeVerdict, VerifySettings, verify_shape
from proxy.upstream.connecting import ConnectionSettings, connect
from proxy.upstream.errors import UpstreamError

EXIT_EQUAL = 0
EXIT_DIFFERENT = 1
EXIT_ERROR = 2

_DEFAULTS = VerifySettings()


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="warmwatch", description=__doc__)
    commands = p.add_subparsers(dest="command", required=True)
    verify = commands.add_parser(
        "verify",
        help="compare every cached collection with the apiserver",
        description="Compare each cached collection with a paginated list from the apiserver "
        "taken at the cache's resourceVersion: objects equal, missing, extra, stale.",
    )
    inspect = commands.add_parser(
        "inspect", help="what the database holds (no apiserver needed)", description=None
    )
    for command in (verify, inspect):
        command.add_argument("--db", type=Path, default=env("db", "warmwatch.db"))
        command.add_argument("-o", "--output", choices=("text", "json"), default="text")
    verify.add_argument("--kubeconfig", default=env("kubeconfig"))
    verify.add_argument("--context", default=env("context"))
    verify.add_argument(
        "--resource",
        action="append",
        default=[],
        metavar="GVR[@NAMESPACE][;protobuf]",
        help="only the collections of this resource (repeatable; default: every one)",
    )
    verify.add_argument("--page-size", type=int, default=_DEFAULTS.page_size)
    verify.add_argument(
        "--examples", type=int, default=_DEFAULTS.examples, help="per kind of difference"
    )
    return p


def main(argv: Sequence[str]) -> int:
    args = parser().parse_args(argv)
    try:
        connection = open_read_only(Path(args.db))
    except InspectError as error:
        print(f"warmwatch {args.command}: {error}", file=sys.stderr)
        return EXIT_ERROR
    try:
        if args.command == "inspect":
            return inspect(connection, path=Path(args.db), output=args.output, out=sys.stdout)
        return asyncio.run(verify(connection, args=args, out=sys.stdout, err=sys.stderr))
    finally:
        connection.close()


# -- inspect ------------------------------------------------------------------------------------


def _when(at: float | None) -> str:
    if at is None:
        return "-"
    return datetime.datetime.fromtimestamp(at, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _table(rows: list[list[str]], out: TextIO) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print(
            "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip(),
            file=out,
        )


def _inspect_document(
    *, path: Path, files: DatabaseFiles, contents: list[ShapeContents]
) -> dict[str, Any]:
    """``warmwatch inspect -o json``: the database and each collection."""
    return {
        "database": {
            "path": str(path),
            "schemaVersion": files.schema_version,
            "pageSize": files.page_size,
            "pages": files.pages,
            "freePages": files.free_pages,
            "dbBytes": files.db_bytes,
            "walBytes": files.wal_bytes,
        },
        "shapes": [
            {
                "id": c.shape.id,
                "shape": c.shape.key.identity,
                "resource": c.shape.key.gvr_label,
                "namespace": c.shape.key.namespace,
                "labelSelector": c.shape.key.label_selector,
                "fieldSelector": c.shape.key.field_selector,
                "encoding": str(c.shape.key.encoding),
                "configured": c.shape.configured,
                "kind": c.shape.kind,
                "resourceVersion": c.shape.rv,
                "objects": c.objects,
                "objectBytes": c.object_bytes,
                "log": {
                    "events": c.events,
                    "startResourceVersion": c.shape.log_start_rv,
                    "oldest": {"resourceVersion": c.oldest.rv, "at": c.oldest.at}
                    if c.oldest
                    else None,
                    "newest": {"resourceVersion": c.newest.rv, "at": c.newest.at}
                    if c.newest
                    else None,
                },
                "lastCommit": c.last_commit,
            }
            for c in contents
        ],
    }


def _inspect_rows(contents: list[ShapeContents]) -> list[list[str]]:
    """``warmwatch inspect``'s table: a header, then a row per collection."""
    rows = [
        [
            "ID",
            "COLLECTION",
            "RV",
            "OBJECTS",
            "BYTES",
            "LOG",
            "OLDEST RV",
            "OLDEST AT",
            "NEWEST RV",
            "NEWEST AT",
            "LAST COMMIT",
        ]
    ]
    for c in contents:
        rows.append(
            [
                str(c.shape.id),
                c.shape.key.identity,
                c.shape.rv or "(filling)",
                f"{c.objects:,}",
                f"{c.object_bytes:,}",
                f"{c.events:,}",
                c.oldest.rv if c.oldest else "-",
                _when(c.oldest.at if c.oldest else None),
                c.newest.rv if c.newest else "-",
                _when(c.newest.at if c.newest else None),
                _when(c.last_commit),
            ]
        )
    return rows


def inspect(connection: sqlite3.Connection, *, path: Path, output: str, out: TextIO) -> int:
    connection.execute("BEGIN")  # one snapshot for the whole report
    try:
        files = database_files(connection, path)
        contents = [shape_contents(connection, shape) for shape in stored_shapes(connection)]
    finally:
        connection.execute("COMMIT")
    if output == "json":
        document = _inspect_document(path=path, files=files, contents=contents)
        out.write(orjson.dumps(document, option=orjson.OPT_INDENT_2).decode() + "\n")
        return EXIT_EQUAL
    print(
        f"{path}: schema version {files.schema_version}, {files.db_bytes:,} bytes "
        f"(+ WAL {files.wal_bytes:,}), {files.pages:,} pages of {files.page_size:,} "
        f"({files.free_pages:,} free), {len(contents)} collections",
        file=out,
    )
    if not contents:
        return EXIT_EQUAL
    _table(_inspect_rows(contents), out)
    return EXIT_EQUAL


# -- verify -------------------------------------------------------------------------------------


def _selected(shapes: list[StoredShape], resources: Sequence[str]) -> list[StoredShape]:
    if not resources:
        return shapes
    flags = [ResourceFlag.parse(r) for r in resources]
    return [
        shape
        for shape in shapes
        if any(
            shape.key.gvr == flag.gvr
            and (flag.namespace is None or (flag.namespace or "") == shape.key.namespace)
            and (not flag.protobuf or shape.key.encoding == "protobuf")
            for flag in flags
        )
    ]


def _verdict_json(verdict: ShapeVerdict) -> dict[str, Any]:
    comparison = verdict.comparison
    document: dict[str, Any] = {
        "shape": verdict.shape.key.identity,
        "cacheResourceVersion": verdict.shape.rv,
    }
    if comparison is None:
        return document | {"skipped": verdict.skipped}
    return document | {
        "listResourceVersion": verdict.list_rv,
        "comparedAtCacheResourceVersion": verdict.exact,
        "equal": comparison.equal,
        **{str(d): n for d, n in comparison.counts.items()},
        "differences": comparison.differences,
        "examples": [
            {
                "difference": str(e.difference),
                "namespace": e.namespace,
                "name": e.name,
                "cacheResourceVersion": e.cache_rv,
                "apiserverResourceVersion": e.upstream_rv,
            }
            for e in comparison.found
        ],
    }


def _print_verdict(verdict: ShapeVerdict, out: TextIO) -> None:
    comparison = verdict.comparison
    if comparison is None:
        print(f"{verdict.shape.key.identity}: skipped ({verdict.skipped})", file=out)
        return
    counts = ", ".join(f"{n:,} {d}" for d, n in comparison.counts.items() if n)
    where = (
        f"at the cache's RV {verdict.list_rv}"
        if verdict.exact
        else f"cache at RV {verdict.shape.rv} (compacted upstream), listed at RV {verdict.list_rv}"
    )
    state = "equal" if not comparison.differences else "DIFFERENT"
    print(
        f"{verdict.shape.key.identity}: {state}: {comparison.equal:,} equal"
        f"{', ' + counts if counts else ''} ({where})",
        file=out,
    )
    for e in comparison.found:
        name = f"{e.namespace}/{e.name}" if e.namespace else e.name
        rvs = []
        if e.cache_rv is not None:
            rvs.append(f"cache RV {e.cache_rv}")
        if e.upstream_rv is not None:
            rvs.append(f"apiserver RV {e.upstream_rv}")
        print(f"  {e.difference:<14} {name}  {', '.join(rvs)}", file=out)


async def verify(
    connection: sqlite3.Connection, *, args: argparse.Namespace, out: TextIO, err: TextIO
) -> int:
    try:
        shapes = _selected(stored_shapes(connection), args.resource)
    except ValueError as error:
        print(f"warmwatch verify: {error}", file=err)
        return EXIT_ERROR
    settings = VerifySettings(page_size=args.page_size, examples=args.examples)

    def progress(shape: StoredShape, listed: int) -> None:
        print(f"  {shape.key.identity}: {listed:,} objects compared ...", file=err, flush=True)

    upstream = await connect(
        ConnectionSettings(kubeconfig=args.kubeconfig, context=args.context), metrics=Metrics()
    )
    verdicts: list[ShapeVerdict] = []
    failures: list[str] = []
    try:
        for index, shape in enumerate(shapes, 1):
            print(f"[{index}/{len(shapes)}] {shape.key.identity} ...", file=err, flush=True)
            try:
                verdict = await verify_shape(
                    connection, upstream, shape, settings=settings, progress=progress
                )
            except (UpstreamError, OutOfOrder, ValueError) as error:
                failures.append(f"{shape.key.identity}: {error}")
                print(f"  {shape.key.identity}: cannot compare: {error}", file=err, flush=True)
                continue
            verdicts.append(verdict)
            if args.output == "text":
                _print_verdict(verdict, out)
    finally:
        await upstream.close()
    different = [v for v in verdicts if v.comparison is not None and v.comparison.differences]
    if args.output == "json":
        document = {
            "shapes": [_verdict_json(v) for v in verdicts],
            "errors": failures,
            "equal": not different and not failures,
        }
        out.write(orjson.dumps(document, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        print(
            f"{len(verdicts)} of {len(shapes)} collections compared: "
            f"{len(different)} with differences, {len(failures)} could not be compared",
            file=out,
        )
    if failures:
        return EXIT_ERROR
    return EXIT_DIFFERENT if different else EXIT_EQUAL


__all__ = ["Difference", "main"]
