"""Label and field selectors: parsing, matching and canonical forms, as apimachinery does.

Label selectors (``labels.Parse``) support the full syntax: ``k=v``, ``k==v``, ``k!=v``,
``k in (a,b)``, ``k notin (a,b)``, ``k``, ``!k``, ``k>N``, ``k<N``; comma is AND; blanks
(space, tab, CR, LF) separate tokens and are otherwise ignored. Keys and values are validated
(see ``labelsyntax``). A parse error's text is exactly the apiserver's, which answers it with
400 BadRequest (the error is raised while decoding the query).

Field selectors (``fields.ParseSelector``) are ``k=v``, ``k==v`` (same as ``=``) and ``k!=v``;
comma is AND; in values ``\\`` escapes ``\\``, ``,`` and ``=``. There is no whitespace
trimming: ``a = b`` selects the field ``"a "``. A missing field reads as ``""``.

Which field labels are valid depends on the type and is decided by the apiserver
(``ConvertFieldLabel``). The proxy knows only the generic ones: ``metadata.name`` always,
and ``metadata.namespace`` for namespaced types. :meth:`FieldSelector.is_locally_servable`
tells whether a selector uses nothing else; any other label (``spec.nodeName`` for pods,
``type`` for secrets, a CRD's selectable fields, or a typo) is not an error here: the request
must go upstream as its own exact shape, and the apiserver either serves it or answers the
400 itself.

Both selector types are immutable and hashable; ``str()`` gives the apimachinery
``String()`` form (requirements sorted by key for labels, by raw term for fields), and
``canonical`` a normalised form (``==`` spelled ``=``, duplicates dropped) for comparing the
shapes of two requests.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import ClassVar, Final

from proxy.kube.gocompat import GoNumError, go_quote, parse_int64
from proxy.kube.labelsyntax import label_key_errors, label_value_errors
from proxy.kube.status import StatusError

__all__ = [
    "GENERIC_FIELD_LABELS",
    "FieldRequirement",
    "FieldSelector",
    "LabelRequirement",
    "LabelSelector",
    "Operator",
    "SelectorSyntaxError",
    "escape_field_value",
    "generic_fields",
]


class SelectorSyntaxError(ValueError):
    """A selector the apiserver would refuse to decode; ``str()`` is its exact message."""

    def to_status(self) -> StatusError:
        """The apiserver's answer: 400 BadRequest with the parse error as message."""
        return StatusError.bad_request(str(self))


class Operator(enum.StrEnum):
    """``selection.Operator`` (values as apimachinery spells them)."""

    EQUALS = "="
    DOUBLE_EQUALS = "=="
    NOT_EQUALS = "!="
    IN = "in"
    NOT_IN = "notin"
    EXISTS = "exists"
    DOES_NOT_EXIST = "!"
    GREATER_THAN = "gt"
    LESS_THAN = "lt"


# ============================================================================ labels

_MATCH_VALUE: Final = frozenset({Operator.EQUALS, Operator.DOUBLE_EQUALS, Operator.IN})
_EXCLUDE_VALUE: Final = frozenset({Operator.NOT_EQUALS, Operator.NOT_IN})


def _compare_integer(op: Operator, value: str | None, values: tuple[str, ...]) -> bool:
    """``>``/``<``: both sides must parse as int64, else no match."""
    if value is None or len(values) != 1:
        return False
    try:
        have = parse_int64(value)
        want = parse_int64(values[0])
    except GoNumError:
        return False
    return have > want if op is Operator.GREATER_THAN else have < want


@dataclass(frozen=True, kw_only=True, slots=True)
class LabelRequirement:
    """One label requirement. ``values`` is sorted and deduplicated (apimachinery keeps
    them in a set); empty for EXISTS / DOES_NOT_EXIST, one value for the others except
    IN / NOT_IN."""

    key: str
    operator: Operator
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        """``Requirement.Matches``. NOT_IN and ``!=`` match when the key is absent; ``>``/``<``
        need the label to parse as an int64 (otherwise no match)."""
        op = self.operator
        value = labels.get(self.key)
        if op in _MATCH_VALUE:
            return value is not None and value in self.values
        if op in _EXCLUDE_VALUE:
            return value is None or value not in self.values
        if op is Operator.EXISTS:
            return value is not None
        if op is Operator.DOES_NOT_EXIST:
            return value is None
        return _compare_integer(op, value, self.values)

    def __str__(self) -> str:
        """``Requirement.String()``."""
        op = self.operator
        if op is Operator.EXISTS:
            return self.key
        if op is Operator.DOES_NOT_EXIST:
            return "!" + self.key
        if op in (Operator.IN, Operator.NOT_IN):
            return f"{self.key} {op.value} ({','.join(self.values)})"
        symbol = {Operator.GREATER_THAN: ">", Operator.LESS_THAN: "<"}.get(op, op.value)
        return f"{self.key}{symbol}{self.values[0] if self.values else ''}"

    @property
    def canonical(self) -> str:
        """``str()`` with ``==`` spelled ``=`` (they mean the same)."""
        if self.operator is Operator.DOUBLE_EQUALS:
            return f"{self.key}={self.values[0]}"
        return str(self)


@dataclass(frozen=True, kw_only=True, slots=True)
class LabelSelector:
    """A parsed label selector: the AND of its requirements (sorted by key, stably)."""

    EVERYTHING: ClassVar[LabelSelector]

    requirements: tuple[LabelRequirement, ...] = ()

    @classmethod
    def parse(cls, text: str) -> LabelSelector:
        """``labels.Parse``. Raises :class:`SelectorSyntaxError` with apimachinery's message."""
        return _parse_label_selector(text)

    @property
    def is_everything(self) -> bool:
        """True when the selector does not restrict anything (empty)."""
        return not self.requirements

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(requirement.matches(labels) for requirement in self.requirements)

    def requires_exact_match(self, key: str) -> str | None:
        """``RequiresExactMatch``: the value the *first* requirement on ``key`` pins
        (``=``, ``==`` or a one-value ``in``), else None."""
        for requirement in self.requirements:
            if requirement.key == key:
                if (
                    requirement.operator in (Operator.EQUALS, Operator.DOUBLE_EQUALS, Operator.IN)
                    and len(requirement.values) == 1
                ):
                    return requirement.values[0]
                return None
        return None

    def __str__(self) -> str:
        """``Selector.String()``: requirements joined by ``,``."""
        return ",".join(str(r) for r in self.requirements)

    @property
    def canonical(self) -> str:
        """A normal form for comparing shapes: ``==`` → ``=``, sorted, duplicates dropped."""
        return ",".join(sorted({r.canonical for r in self.requirements}, key=_canonical_sort_key))


def _canonical_sort_key(text: str) -> tuple[str, str]:
    key = text[1:] if text.startswith("!") else text
    for index, ch in enumerate(key):
        if ch in "=!<> ":
            key = key[:index]
            break
    return (key, text)


LabelSelector.EVERYTHING = LabelSelector()


# Label lexer / parser: a port of apimachinery's hand-written one, errors included.


class _Tok(enum.Enum):
    END = enum.auto()
    CLOSE_PAR = enum.auto()
    COMMA = enum.auto()
    NOT = enum.auto()
    DOUBLE_EQUALS = enum.auto()
    EQUALS = enum.auto()
    GREATER_THAN = enum.auto()
    IDENTIFIER = enum.auto()
    IN = enum.auto()
    LESS_THAN = enum.auto()
    NOT_EQUALS = enum.auto()
    NOT_IN = enum.auto()
    OPEN_PAR = enum.auto()


_SYMBOL_TOKENS: Final = {
    ")": _Tok.CLOSE_PAR,
    ",": _Tok.COMMA,
    "!": _Tok.NOT,
    "==": _Tok.DOUBLE_EQUALS,
    "=": _Tok.EQUALS,
    ">": _Tok.GREATER_THAN,
    "<": _Tok.LESS_THAN,
    "!=": _Tok.NOT_EQUALS,
    "(": _Tok.OPEN_PAR,
}
_KEYWORD_TOKENS: Final = {"in": _Tok.IN, "notin": _Tok.NOT_IN}
_SPECIAL: Final = frozenset("=!(),><")
_BLANK: Final = frozenset(" \t\r\n")
_STOP: Final = _SPECIAL | _BLANK
_BINARY_OPERATORS_TEXT: Final = "in, notin, =, ==, !=, gt, lt"

_Item = tuple[_Tok, str]


def _lex(text: str) -> list[_Item]:
    """``labels.Lexer``, ported with its read/unread cursor. Go's ``read()`` yields a NUL byte
    at the end of the input, so a NUL *in* the input ends it when a token would start, and is
    swallowed as a separator when it ends an identifier or a symbol."""
    size = len(text)
    pos = 0
    items: list[_Item] = []

    def read() -> str:
        nonlocal pos
        if pos < size:
            pos += 1
            return text[pos - 1]
        return "\0"

    while True:
        ch = read()
        while ch in _BLANK:
            ch = read()
        if ch == "\0":
            items.append((_Tok.END, ""))
            return items
        pos -= 1  # unread: the scanners below start from this character
        literal = ""
        if ch in _SPECIAL:
            token: _Tok | None = None
            while True:
                ch = read()
                if ch == "\0":
                    break
                if ch not in _SPECIAL:
                    pos -= 1
                    break
                candidate = _SYMBOL_TOKENS.get(literal + ch)
                if candidate is None:
                    pos -= 1  # every single symbol is a token, so ``token`` is set here
                    break
                token, literal = candidate, literal + ch
            assert token is not None
            items.append((token, literal))
            continue
        while True:
            ch = read()
            if ch == "\0":
                break
            if ch in _STOP:
                pos -= 1
                break
            literal += ch
        items.append((_KEYWORD_TOKENS.get(literal, _Tok.IDENTIFIER), literal))


class _LabelParser:
    """Recursive descent over the token list, as ``labels.Parser``. In a *values* context
    the keywords ``in``/``notin`` are plain identifiers (``in in (in)`` is valid)."""

    __slots__ = ("items", "position")

    def __init__(self, text: str) -> None:
        self.items = _lex(text)
        self.position = 0

    def lookahead(self, *, values: bool) -> _Item:
        tok, lit = self.items[self.position]
        if values and tok in (_Tok.IN, _Tok.NOT_IN):
            tok = _Tok.IDENTIFIER
        return tok, lit

    def consume(self, *, values: bool) -> _Item:
        item = self.lookahead(values=values)
        self.position += 1
        return item

    def parse(self) -> list[LabelRequirement]:
        requirements: list[LabelRequirement] = []
        while True:
            tok, lit = self.lookahead(values=True)
            if tok in (_Tok.IDENTIFIER, _Tok.NOT):
                try:
                    requirements.append(self.requirement())
                except _RequirementError as exc:
                    raise SelectorSyntaxError(f"unable to parse requirement: {exc}") from None
                tok, lit = self.consume(values=True)
                if tok is _Tok.END:
                    return requirements
                if tok is not _Tok.COMMA:
                    raise SelectorSyntaxError(f"found '{lit}', expected: ',' or 'end of string'")
                tok, lit = self.lookahead(values=True)
                if tok not in (_Tok.IDENTIFIER, _Tok.NOT):
                    raise SelectorSyntaxError(f"found '{lit}', expected: identifier after ','")
            elif tok is _Tok.END:
                return requirements
            else:
                raise SelectorSyntaxError(
                    f"found '{lit}', expected: !, identifier, or 'end of string'"
                )

    def requirement(self) -> LabelRequirement:
        key, operator = self.key_and_inferred_operator()
        if operator is not None:
            return _new_requirement(key=key, operator=operator, values=())
        operator = self.operator()
        if operator in (Operator.IN, Operator.NOT_IN):
            values = self.value_set()
        else:
            values = self.exact_value()
        return _new_requirement(key=key, operator=operator, values=tuple(sorted(values)))

    def key_and_inferred_operator(self) -> tuple[str, Operator | None]:
        operator: Operator | None = None
        tok, lit = self.consume(values=True)
        if tok is _Tok.NOT:
            operator = Operator.DOES_NOT_EXIST
            tok, lit = self.consume(values=True)
        if tok is not _Tok.IDENTIFIER:
            raise _RequirementError(f"found '{lit}', expected: identifier")
        errors = label_key_errors(lit)
        if errors:
            # The parser validates with a nil field path, which Go prints as "<nil>".
            raise _RequirementError(f"<nil>: Invalid value: {go_quote(lit)}: {'; '.join(errors)}")
        following, _ = self.lookahead(values=True)
        if following in (_Tok.END, _Tok.COMMA) and operator is None:
            operator = Operator.EXISTS
        return lit, operator

    def operator(self) -> Operator:
        tok, lit = self.consume(values=False)
        operator = _BINARY_OPERATORS.get(tok)
        if operator is None:
            raise _RequirementError(f"found '{lit}', expected: {_BINARY_OPERATORS_TEXT}")
        return operator

    def value_set(self) -> set[str]:
        tok, lit = self.consume(values=True)
        if tok is not _Tok.OPEN_PAR:
            raise _RequirementError(f"found '{lit}' expected: '('")
        tok, lit = self.lookahead(values=True)
        if tok in (_Tok.IDENTIFIER, _Tok.COMMA):
            values = self.identifier_list()
            if self.consume(values=True)[0] is not _Tok.CLOSE_PAR:  # pragma: no cover
                raise _RequirementError(f"found '{lit}', expected: ')'")
            return values
        if tok is _Tok.CLOSE_PAR:  # "()" is the one empty value
            self.consume(values=True)
            return {""}
        raise _RequirementError(f"found '{lit}', expected: ',', ')' or identifier")

    def identifier_list(self) -> set[str]:
        values: set[str] = set()
        while True:
            tok, lit = self.consume(values=True)
            if tok is _Tok.IDENTIFIER:
                values.add(lit)
                following, following_lit = self.lookahead(values=True)
                if following is _Tok.COMMA:
                    continue
                if following is _Tok.CLOSE_PAR:
                    return values
                raise _RequirementError(f"found '{following_lit}', expected: ',' or ')'")
            if tok is _Tok.COMMA:
                # Empty items are the empty value: "(,a)", "(a,,b)", "(a,)".
                if not values:
                    values.add("")
                following, _ = self.lookahead(values=True)
                if following is _Tok.CLOSE_PAR:
                    values.add("")
                    return values
                if following is _Tok.COMMA:
                    values.add("")
                continue
            raise _RequirementError(f"found '{lit}', expected: ',', or identifier")

    def exact_value(self) -> set[str]:
        tok, _ = self.lookahead(values=True)
        if tok in (_Tok.END, _Tok.COMMA):
            return {""}
        tok, lit = self.consume(values=True)
        if tok is _Tok.IDENTIFIER:
            return {lit}
        raise _RequirementError(f"found '{lit}', expected: identifier")


class _RequirementError(Exception):
    """Internal: a requirement-level error, wrapped as ``unable to parse requirement: ...``."""


_BINARY_OPERATORS: Final = {
    _Tok.IN: Operator.IN,
    _Tok.EQUALS: Operator.EQUALS,
    _Tok.DOUBLE_EQUALS: Operator.DOUBLE_EQUALS,
    _Tok.GREATER_THAN: Operator.GREATER_THAN,
    _Tok.LESS_THAN: Operator.LESS_THAN,
    _Tok.NOT_IN: Operator.NOT_IN,
    _Tok.NOT_EQUALS: Operator.NOT_EQUALS,
}


def _new_requirement(*, key: str, operator: Operator, values: tuple[str, ...]) -> LabelRequirement:
    """``labels.NewRequirement`` checks the parser can still fail: integer values for
    ``>``/``<`` and value syntax. Several errors are reported as ``[a, b]``."""
    errors: list[str] = []
    if operator in (Operator.GREATER_THAN, Operator.LESS_THAN):
        for index, value in enumerate(values):
            try:
                parse_int64(value)
            except GoNumError:
                errors.append(
                    f"values[{index}]: Invalid value: {go_quote(value)}: "
                    "for 'Gt', 'Lt' operators, the value must be an integer"
                )
    for index, value in enumerate(values):
        messages = label_value_errors(value)
        if messages:
            errors.append(
                f"values[{index}][{key}]: Invalid value: {go_quote(value)}: {'; '.join(messages)}"
            )
    if errors:
        unique = list(dict.fromkeys(errors))
        raise _RequirementError(unique[0] if len(unique) == 1 else "[" + ", ".join(unique) + "]")
    return LabelRequirement(key=key, operator=operator, values=values)


@lru_cache(maxsize=1024)
def _parse_label_selector(text: str) -> LabelSelector:
    requirements = _LabelParser(text).parse()
    requirements.sort(key=lambda r: r.key)  # stable, like Go's insertion sort on small inputs
    return LabelSelector(requirements=tuple(requirements))


# ============================================================================ fields

#: Field labels every type supports (``metadata.namespace`` only where namespaced).
GENERIC_FIELD_LABELS: Final = frozenset({"metadata.name", "metadata.namespace"})


def generic_fields(*, name: str, namespace: str) -> dict[str, str]:
    """The field set a field selector on generic labels matches against."""
    return {"metadata.name": name, "metadata.namespace": namespace}


def escape_field_value(value: str) -> str:
    """``fields.EscapeValue``: ``\\`` → ``\\\\``, ``,`` → ``\\,``, ``=`` → ``\\=``."""
    return value.replace("\\", "\\\\").replace(",", "\\,").replace("=", "\\=")


def _unescape_field_value(raw: str) -> str:
    """``fields.UnescapeValue`` with its error texts."""
    if not any(ch in raw for ch in "\\,="):
        return raw
    out: list[str] = []
    in_slash = False
    for ch in raw:
        if in_slash:
            if ch not in "\\,=":
                raise SelectorSyntaxError(
                    f"invalid field selector: invalid escape sequence: \\{ch}"
                )
            out.append(ch)
            in_slash = False
        elif ch == "\\":
            in_slash = True
        elif ch in ",=":
            # Go prints the rune with %v: its code point as a decimal number.
            raise SelectorSyntaxError(
                f"invalid field selector: unescaped character in value: {ord(ch)}"
            )
        else:
            out.append(ch)
    if in_slash:
        raise SelectorSyntaxError("invalid field selector: invalid escape sequence: \\")
    return "".join(out)


@dataclass(frozen=True, kw_only=True, slots=True)
class FieldRequirement:
    """``field = value`` (EQUALS, also for ``==``) or ``field != value`` (NOT_EQUALS).
    ``value`` is unescaped."""

    field: str
    operator: Operator
    value: str

    def matches(self, fields: Mapping[str, str]) -> bool:
        """A field missing from ``fields`` reads as ``""`` (``Fields.Get``)."""
        equal = fields.get(self.field, "") == self.value
        return equal if self.operator is Operator.EQUALS else not equal

    def __str__(self) -> str:
        symbol = "=" if self.operator is Operator.EQUALS else "!="
        return f"{self.field}{symbol}{escape_field_value(self.value)}"


@dataclass(frozen=True, kw_only=True, slots=True)
class FieldSelector:
    """A parsed field selector: the AND of its requirements, in apimachinery's order
    (raw terms sorted as strings)."""

    EVERYTHING: ClassVar[FieldSelector]

    requirements: tuple[FieldRequirement, ...] = ()

    @classmethod
    def parse(cls, text: str) -> FieldSelector:
        """``fields.ParseSelector``. Raises :class:`SelectorSyntaxError`."""
        return _parse_field_selector(text)

    @property
    def is_everything(self) -> bool:
        return not self.requirements

    def matches(self, fields: Mapping[str, str]) -> bool:
        return all(requirement.matches(fields) for requirement in self.requirements)

    def requires_exact_match(self, field: str) -> str | None:
        """``RequiresExactMatch``: the value of the first ``field=value`` term, else None.
        (``metadata.name=X`` makes a LIST/WATCH a single-object request.)"""
        for requirement in self.requirements:
            if requirement.field == field and requirement.operator is Operator.EQUALS:
                return requirement.value
        return None

    def is_locally_servable(self, *, namespaced: bool | None) -> bool:
        """True when every term uses a generic field label the proxy can evaluate itself:
        ``metadata.name``, and ``metadata.namespace`` when the type is known to be
        namespaced (``namespaced=True``).

        False means "needs upstream", not "invalid": serve the request from an exact upstream
        shape and let the apiserver judge the labels. ``metadata.namespace`` on a
        cluster-scoped or unknown type goes upstream too, because the apiserver's answer
        differs by type there (nodes, namespaces and custom resources reject it with 400;
        other built-in types accept it).
        """
        for requirement in self.requirements:
            label = requirement.field
            if label == "metadata.name":
                continue
            if label == "metadata.namespace" and namespaced:
                continue
            return False
        return True

    def __str__(self) -> str:
        return ",".join(str(r) for r in self.requirements)

    @property
    def canonical(self) -> str:
        """A normal form for comparing shapes: sorted, duplicates dropped."""
        return ",".join(sorted({str(r) for r in self.requirements}))


FieldSelector.EVERYTHING = FieldSelector()


def _split_field_terms(text: str) -> list[str]:
    """``splitTerms``: split on commas not escaped by a backslash (escapes kept)."""
    terms: list[str] = []
    start = 0
    in_slash = False
    for index, ch in enumerate(text):
        if in_slash:
            in_slash = False
        elif ch == "\\":
            in_slash = True
        elif ch == ",":
            terms.append(text[start:index])
            start = index + 1
    terms.append(text[start:])
    return terms


_TERM_OPERATORS: Final = (
    ("!=", Operator.NOT_EQUALS),
    ("==", Operator.EQUALS),
    ("=", Operator.EQUALS),
)


def _split_field_term(term: str) -> tuple[str, Operator, str] | None:
    """``splitTerm``: the first operator occurrence splits (no escaping in the field)."""
    for index in range(len(term)):
        for symbol, operator in _TERM_OPERATORS:
            if term.startswith(symbol, index):
                return term[:index], operator, term[index + len(symbol) :]
    return None


@lru_cache(maxsize=1024)
def _parse_field_selector(text: str) -> FieldSelector:
    if not text:
        return FieldSelector()
    requirements: list[FieldRequirement] = []
    for term in sorted(_split_field_terms(text)):
        if not term:
            continue
        split = _split_field_term(term)
        if split is None:
            raise SelectorSyntaxError(f"invalid selector: '{text}'; can't understand '{term}'")
        field, operator, raw_value = split
        value = _unescape_field_value(raw_value)
        if not field and not value:
            # The identity transform ParseSelector applies drops a bare "=" term.
            continue
        requirements.append(FieldRequirement(field=field, operator=operator, value=value))
    return FieldSelector(requirements=tuple(requirements))
