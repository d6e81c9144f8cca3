"""LIST/WATCH query options: decoding, validation and semantics, as kube-apiserver does.

The apiserver handles a collection request in this order (v1.37 ``handlers/get.go``,
``storage/interfaces.go``), and :meth:`ListOptions.parse` reproduces it:

1. **Decode** the query (``ParameterCodec.DecodeParameters``). Only the first value of a
   repeated parameter counts. Failures are 400 BadRequest with the bare Go error as message:
   ``timeoutSeconds`` then ``limit`` (``strconv.ParseInt: parsing "x": invalid syntax``), then
   ``labelSelector`` and ``fieldSelector`` syntax. Booleans never fail: only ``0`` and
   ``false`` (any case) are false, anything else (even an empty value, ``watch=True`` from
   the Python clients) is true. ``timeout`` (a Go duration client-go sends) is ignored.
2. **Default and validate** (``SetListOptionsDefaults`` + ``ValidateListOptions``, WatchList
   feature on as in 1.34+): 422 Invalid, kind ``ListOptions``, group ``meta.k8s.io``, one
   cause per rule broken. WATCH rules apply when the ``watch`` *parameter* is true; a request
   on the deprecated ``/watch/`` path without ``watch=true`` is validated with the LIST rules
   (so ``sendInitialEvents`` there is "forbidden for list").
3. **Storage checks**: for a LIST a non-numeric RV is 400, for a WATCH a reasonless 500 (see
   ``versions``). A LIST with ``continue`` is not checked here: it is always passed through,
   and the apiserver decodes its token (400 ``invalid continue token: ...``) before it looks
   at the RV, so its checks are the apiserver's own answer.

Field *labels* (which fields a type supports) are not checked here: see
``FieldSelector.is_locally_servable``.

:func:`list_semantics` and :func:`watch_start` then classify what a valid request asks for,
per the apiserver's own rules (docs/design.md §5).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final, TypeAlias

from proxy.kube.field_errors import FieldError
from proxy.kube.gocompat import GoNumError, parse_int64
from proxy.kube.selectors import FieldSelector, LabelSelector, SelectorSyntaxError
from proxy.kube.status import StatusError
from proxy.kube.versions import InvalidResourceVersion, parse_query_resource_version

__all__ = [
    "ListOptions",
    "ListSemantics",
    "ListSemanticsKind",
    "QueryInput",
    "ResourceVersionMatch",
    "WatchStart",
    "WatchStartKind",
    "check_storage_options",
    "decode_list_options",
    "first_values",
    "list_options_errors",
    "list_semantics",
    "parse_bool",
    "validate_list_options",
    "watch_start",
]

#: A query as pairs (``request.query.items()``), a mapping of first values (a MultiDict),
#: or a mapping of value lists (``urllib.parse.parse_qs``).
QueryInput: TypeAlias = Mapping[str, str] | Mapping[str, Sequence[str]] | Iterable[tuple[str, str]]


class ResourceVersionMatch(enum.StrEnum):
    """``metav1.ResourceVersionMatch`` (case-sensitive on the wire)."""

    NOT_OLDER_THAN = "NotOlderThan"
    EXACT = "Exact"


def first_values(query: QueryInput) -> dict[str, str]:
    """The first value of each parameter, as Go's ``url.Values`` decoding uses them.

    A parameter given with an empty list of values counts as absent.
    """
    out: dict[str, str] = {}
    if isinstance(query, Mapping):
        # A multidict's items() yields every pair, repeats included: keep the first.
        for key, value in query.items():
            if isinstance(value, str):
                out.setdefault(key, value)
            elif value:
                out.setdefault(key, value[0])
        return out
    for key, value in query:
        out.setdefault(key, value)
    return out


def selector_bytes(query: QueryInput) -> int:
    """The length (UTF-8) of a collection query's label and field selectors together, as the
    apiserver decodes them, before anything parses them."""
    values = first_values(query)
    return sum(len(values.get(name, "").encode()) for name in ("labelSelector", "fieldSelector"))


def parse_bool(value: str) -> bool:
    """``runtime.Convert_Slice_string_To_bool``: false only for ``0`` and ``false`` in any
    case (Go's ``EqualFold``); everything else, the empty string included, is true."""
    if value == "0":
        return False
    return not (len(value) == 5 and value.casefold() == "false")


_DECODED_INTS: Final = ("timeoutSeconds", "limit")  # Go's conversion order


@dataclass(frozen=True, kw_only=True, slots=True)
class ListOptions:
    """Decoded LIST/WATCH options. Empty strings are normalised to None ("unset").

    ``watch`` is the query parameter; ``watch_path`` the deprecated ``/watch/`` prefix;
    :attr:`is_watch` is either. ``limit`` is kept as sent (``<= 0`` means no limit).
    ``resource_version_match`` is the raw value until validated.
    """

    resource_version: str | None = None
    resource_version_match: str | None = None
    limit: int | None = None
    continue_token: str | None = None
    label_selector: LabelSelector = LabelSelector.EVERYTHING
    field_selector: FieldSelector = FieldSelector.EVERYTHING
    timeout_seconds: int | None = None
    watch: bool = False
    watch_path: bool = False
    allow_watch_bookmarks: bool = False
    send_initial_events: bool | None = None

    @classmethod
    def parse(cls, query: QueryInput, *, watch_path: bool = False) -> ListOptions:
        """Decode, validate and storage-check a collection query, in the apiserver's order.

        Raises the :class:`StatusError` the apiserver would answer (400, 422 or, for a WATCH
        with a non-numeric RV, 500).
        """
        options = decode_list_options(query, watch_path=watch_path)
        validate_list_options(options)
        check_storage_options(options)
        rv = options.resource_version
        if rv is not None and rv != "0" and rv.isascii() and rv.isdigit():
            # The apiserver parses a query RV as a uint64: "007" is 7 (and "00" is 0), so
            # the rest of warmwatch sees the canonical form, which the log can compare.
            canonical = str(parse_query_resource_version(rv))
            if canonical != rv:
                options = dataclasses.replace(options, resource_version=canonical)
        return options

    @property
    def is_watch(self) -> bool:
        """A WATCH: ``watch`` parameter true or the ``/watch/`` path."""
        return self.watch or self.watch_path

    @property
    def page_limit(self) -> int | None:
        """``limit`` when it asks for pagination (``> 0``), else None."""
        return self.limit if self.limit is not None and self.limit > 0 else None


def decode_list_options(query: QueryInput, *, watch_path: bool = False) -> ListOptions:
    """Step 1: decode the query. Raises 400 BadRequest :class:`StatusError`."""
    values = first_values(query)
    ints: dict[str, int | None] = {}
    for name in _DECODED_INTS:
        raw = values.get(name)
        try:
            ints[name] = None if raw is None else parse_int64(raw)
        except GoNumError as exc:
            raise StatusError.bad_request(str(exc)) from None
    try:
        label_selector = LabelSelector.parse(values.get("labelSelector", ""))
        field_selector = FieldSelector.parse(values.get("fieldSelector", ""))
    except SelectorSyntaxError as exc:
        raise exc.to_status() from None
    send_initial = values.get("sendInitialEvents")
    return ListOptions(
        resource_version=values.get("resourceVersion") or None,
        resource_version_match=values.get("resourceVersionMatch") or None,
        limit=ints["limit"],
        continue_token=values.get("continue") or None,
        label_selector=label_selector,
        field_selector=field_selector,
        timeout_seconds=ints["timeoutSeconds"],
        watch=parse_bool(values["watch"]) if "watch" in values else False,
        watch_path=watch_path,
        allow_watch_bookmarks=(
            parse_bool(values["allowWatchBookmarks"]) if "allowWatchBookmarks" in values else False
        ),
        send_initial_events=None if send_initial is None else parse_bool(send_initial),
    )


# ------------------------------------------------------------------ validation

_RVM: Final = "resourceVersionMatch"
_SIE: Final = "sendInitialEvents"


def list_options_errors(options: ListOptions) -> list[FieldError]:
    """Step 2: the field errors of ``SetListOptionsDefaults`` + ``ValidateListOptions``
    (WatchList enabled), in the apiserver's order."""
    match = options.resource_version_match
    send_initial = options.send_initial_events
    if not options.watch:
        return _list_errors(options, match=match)
    if send_initial is None and match is None and options.resource_version in (None, "0"):
        # SetListOptionsDefaults turns a legacy watch into a WatchList request before
        # validating it; this is why ?watch=1&continue=x is refused below.
        send_initial, match = True, ResourceVersionMatch.NOT_OLDER_THAN
    errors: list[FieldError] = []
    if send_initial is not None and match != ResourceVersionMatch.NOT_OLDER_THAN:
        errors.append(
            FieldError.forbidden(
                field=_RVM,
                detail="sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
            )
        )
    if match is not None:
        if send_initial is None:
            errors.append(
                FieldError.forbidden(
                    field=_RVM,
                    detail="resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided",
                )
            )
        if match != ResourceVersionMatch.NOT_OLDER_THAN:
            errors.append(
                FieldError.not_supported(
                    field=_RVM, value=match, supported=[ResourceVersionMatch.NOT_OLDER_THAN]
                )
            )
        if options.continue_token:
            errors.append(
                FieldError.forbidden(
                    field=_RVM, detail="resourceVersionMatch is forbidden when continue is provided"
                )
            )
    return errors


def _list_errors(options: ListOptions, *, match: str | None) -> list[FieldError]:
    errors: list[FieldError] = []
    if match is not None:
        if options.resource_version is None:
            errors.append(
                FieldError.forbidden(
                    field=_RVM,
                    detail="resourceVersionMatch is forbidden unless resourceVersion is provided",
                )
            )
        if options.continue_token:
            errors.append(
                FieldError.forbidden(
                    field=_RVM, detail="resourceVersionMatch is forbidden when continue is provided"
                )
            )
        if match not in (ResourceVersionMatch.EXACT, ResourceVersionMatch.NOT_OLDER_THAN):
            errors.append(
                FieldError.not_supported(
                    field=_RVM,
                    value=match,
                    supported=[ResourceVersionMatch.EXACT, ResourceVersionMatch.NOT_OLDER_THAN, ""],
                )
            )
        if match == ResourceVersionMatch.EXACT and options.resource_version == "0":
            errors.append(
                FieldError.forbidden(
                    field=_RVM,
                    detail='resourceVersionMatch "exact" is forbidden for resourceVersion "0"',
                )
            )
    if options.send_initial_events is not None:
        errors.append(
            FieldError.forbidden(field=_SIE, detail="sendInitialEvents is forbidden for list")
        )
    return errors


def validate_list_options(options: ListOptions) -> None:
    """Step 2: raise the 422 Invalid :class:`StatusError` if any rule is broken."""
    errors = list_options_errors(options)
    if errors:
        raise StatusError.invalid_list_options(errors)


def check_storage_options(options: ListOptions) -> None:
    """Step 3: the storage layer's checks of ``continue`` and ``resourceVersion``.

    LIST: a set RV must parse (400 ``invalid resource version: ...``); with ``continue``
    nothing is checked (the apiserver answers it: see the module docstring). WATCH: a set RV
    must parse (500, no reason).
    """
    rv = options.resource_version
    if options.is_watch:
        if rv is not None:
            try:
                parse_query_resource_version(rv)
            except InvalidResourceVersion as exc:
                raise exc.to_status(watch=True) from None
        return
    if options.continue_token:
        return
    if rv is not None:
        try:
            parse_query_resource_version(rv)
        except InvalidResourceVersion as exc:
            raise exc.to_status(watch=False) from None


# ------------------------------------------------------------------- semantics


class ListSemanticsKind(enum.StrEnum):
    """What state a LIST (or a watch's initial state) must reflect."""

    MOST_RECENT = "MostRecent"  # RV unset: a consistent read at the current revision
    ANY = "Any"  # RV "0": any state the server has (the cache's current one)
    NOT_OLDER_THAN = "NotOlderThan"  # at least RV N
    EXACT = "Exact"  # exactly RV N (410 Expired when gone)
    CONTINUE = "Continue"  # the next page of a paginated list (its token fixes the RV)


@dataclass(frozen=True, kw_only=True, slots=True)
class ListSemantics:
    """A LIST's meaning. ``resource_version`` is N for NOT_OLDER_THAN / EXACT; ``limit`` is the
    page size the apiserver honours (None: the whole list, no ``continue``)."""

    kind: ListSemanticsKind
    resource_version: str | None = None
    limit: int | None = None


def list_semantics(options: ListOptions) -> ListSemantics:
    """Classify a validated LIST (docs/design.md §5).

    ============================  ===========  ===============  ===========================
    resourceVersionMatch          RV unset     RV "0"           RV N
    ============================  ===========  ===============  ===========================
    unset, no limit               MOST_RECENT  ANY              NOT_OLDER_THAN N
    unset, limit                  MOST_RECENT  ANY (no limit)   EXACT N
    NotOlderThan                  (invalid)    ANY (no limit)   NOT_OLDER_THAN N
    Exact                         (invalid)    (invalid)        EXACT N
    ============================  ===========  ===============  ===========================

    A ``continue`` token makes it CONTINUE (the token is not decoded: such a page is passed
    through). RV "0" ignores ``limit`` because the watch cache does (``computeListLimit``).
    Raises ValueError for a WATCH or an unvalidated combination.
    """
    if options.is_watch:
        raise ValueError("list_semantics() of a watch request")
    rv = options.resource_version
    match = options.resource_version_match
    limit = options.page_limit
    if options.continue_token:
        return ListSemantics(kind=ListSemanticsKind.CONTINUE, limit=limit)
    if rv == "0" and match != ResourceVersionMatch.EXACT:
        return ListSemantics(kind=ListSemanticsKind.ANY)
    if match is None:
        if rv is None:
            return ListSemantics(kind=ListSemanticsKind.MOST_RECENT, limit=limit)
        if limit is not None:
            return ListSemantics(kind=ListSemanticsKind.EXACT, resource_version=rv, limit=limit)
        return ListSemantics(kind=ListSemanticsKind.NOT_OLDER_THAN, resource_version=rv)
    if rv is not None and match == ResourceVersionMatch.EXACT:
        # Also RV "0" read from "00", which validation (comparing with the literal "0") lets
        # through: the apiserver's own answer to it is an Exact read's (found by fuzzing).
        return ListSemantics(kind=ListSemanticsKind.EXACT, resource_version=rv, limit=limit)
    if rv is not None and rv != "0":
        if match == ResourceVersionMatch.NOT_OLDER_THAN:
            kind = ListSemanticsKind.NOT_OLDER_THAN
            return ListSemantics(kind=kind, resource_version=rv, limit=limit)
        if match == ResourceVersionMatch.EXACT:
            return ListSemantics(kind=ListSemanticsKind.EXACT, resource_version=rv, limit=limit)
    raise ValueError(f"invalid list options: resourceVersion={rv!r} resourceVersionMatch={match!r}")


class WatchStartKind(enum.StrEnum):
    """Where a WATCH starts."""

    INITIAL_STATE = "InitialState"  # synthetic ADDED for the current state, then changes
    FROM_RESOURCE_VERSION = "FromResourceVersion"  # every change after resource_version
    FROM_NOW = "FromNow"  # changes after the current RV, no synthetic events


@dataclass(frozen=True, kw_only=True, slots=True)
class WatchStart:
    """A WATCH's start.

    ``freshness`` (for INITIAL_STATE / FROM_NOW) says which state to start from: MOST_RECENT
    (RV unset: at least the upstream's current RV), ANY (RV "0") or NOT_OLDER_THAN
    ``resource_version``. For FROM_RESOURCE_VERSION, ``resource_version`` is the RV after
    which events are sent. ``initial_events_end_bookmark``: send the BOOKMARK annotated
    ``k8s.io/initial-events-end: "true"`` after the initial state.
    """

    kind: WatchStartKind
    resource_version: str | None = None
    freshness: ListSemanticsKind | None = None
    initial_events_end_bookmark: bool = False


def _freshness(rv: str | None) -> ListSemanticsKind:
    if rv is None:
        return ListSemanticsKind.MOST_RECENT
    if rv == "0":
        return ListSemanticsKind.ANY
    return ListSemanticsKind.NOT_OLDER_THAN


def watch_start(options: ListOptions) -> WatchStart:
    """Classify a validated WATCH (docs/design.md §5, the apiserver's watch cache).

    ===================  ===========================  ==========================  ===========
    sendInitialEvents    RV unset                     RV "0"                      RV N
    ===================  ===========================  ==========================  ===========
    unset                INITIAL_STATE (most recent)  INITIAL_STATE (any)         FROM_RV N
    true                 INITIAL_STATE (most recent)  INITIAL_STATE (any)         INITIAL_STATE (≥ N)
    false                FROM_NOW (most recent)       FROM_NOW (any)              FROM_RV N
    ===================  ===========================  ==========================  ===========

    The initial-events-end bookmark is sent when ``allowWatchBookmarks=true`` and the watch is
    a WatchList: ``sendInitialEvents=true``, or — as a 1.34+ apiserver defaults it
    (``SetListOptionsDefaults``) — a ``watch=true`` request with RV unset/"0" and neither
    ``sendInitialEvents`` nor ``resourceVersionMatch``. Without bookmarks allowed the
    apiserver sends the initial state and no bookmark; it does not refuse the request. The
    defaulting looks at the ``watch`` *parameter*: the deprecated ``/watch/`` path alone is
    not defaulted, so it gets no bookmark.

    Raises ValueError for a LIST.
    """
    if not options.is_watch:
        raise ValueError("watch_start() of a list request")
    rv = options.resource_version
    send_initial = options.send_initial_events
    if send_initial:
        return WatchStart(
            kind=WatchStartKind.INITIAL_STATE,
            resource_version=rv if rv not in (None, "0") else None,
            freshness=_freshness(rv),
            initial_events_end_bookmark=options.allow_watch_bookmarks,
        )
    if rv is not None and rv != "0":
        return WatchStart(kind=WatchStartKind.FROM_RESOURCE_VERSION, resource_version=rv)
    if send_initial is None:
        defaulted = options.watch and options.resource_version_match is None
        return WatchStart(
            kind=WatchStartKind.INITIAL_STATE,
            freshness=_freshness(rv),
            initial_events_end_bookmark=defaulted and options.allow_watch_bookmarks,
        )
    return WatchStart(kind=WatchStartKind.FROM_NOW, freshness=_freshness(rv))


#: Subresources the apiserver treats as long-running (``LongRunningRequestCheck``).
_LONG_RUNNING_SUBRESOURCES: Final = frozenset({"exec", "attach", "portforward", "proxy", "log"})


def is_long_running(path: str, query: Mapping[str, str]) -> bool:
    """Watches, followed logs, exec/attach/portforward/proxy: requests with no natural end
    (``query``: the first value of each parameter)."""
    if "watch" in query and parse_bool(query["watch"]):
        return True
    parts = [p for p in path.split("/") if p]
    # /api/v1/watch/... and /apis/G/V/watch/... (deprecated watch prefix)
    if len(parts) > 2 and parts[0] == "api" and parts[2] == "watch":
        return True
    if len(parts) > 3 and parts[0] == "apis" and parts[3] == "watch":
        return True
    return any(part in _LONG_RUNNING_SUBRESOURCES for part in parts[2:])
