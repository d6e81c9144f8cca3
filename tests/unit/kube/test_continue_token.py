"""Continue tokens: format and DecodeContinue errors (expected texts from apiserver v0.37.2)."""

from __future__ import annotations

import base64

import pytest

from proxy.kube.continue_token import ContinueToken, InvalidContinueToken


def b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


@pytest.mark.parametrize(
    ("token", "rv", "start"),
    [
        (
            "eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6NSwic3RhcnQiOiJucy9uYW1lXHUwMDAwIn0",
            5,
            "ns/name\x00",
        ),
        (b64(b'{"v":"meta.k8s.io/v1","rv":-1,"start":"a"}'), -1, "a"),
        (
            b64(b'{"V":"meta.k8s.io/v1","RV":5,"Start":"a"}'),
            5,
            "a",
        ),  # Go matches keys case-insensitively
        (b64(b'{"v":"meta.k8s.io/v1","rv":5,"start":"/a/b"}'), 5, "a/b"),
        (b64(b'{"v":"meta.k8s.io/v1","rv":5,"start":"a","extra":[1]}'), 5, "a"),
        ("eyJ2IjoibWV0YS5rOHMuaW8v\ndjEiLCJydiI6NSwic3RhcnQiOiJhIn0", 5, "a"),  # CR/LF are skipped
    ],
)
def test_decode(token: str, rv: int, start: str) -> None:
    decoded = ContinueToken.decode(token)
    assert (decoded.resource_version, decoded.start_key) == (rv, start)


@pytest.mark.parametrize(
    ("token", "error"),
    [
        ("a", "illegal base64 data at input byte 0"),
        ("abcde", "illegal base64 data at input byte 4"),
        ("ab==", "illegal base64 data at input byte 2"),
        ("a b", "illegal base64 data at input byte 1"),
        ("é", "illegal base64 data at input byte 0"),
        (
            b64(b'{"v":"meta.k8s.io/v1","rv":5,"start":"a"}') + "=",
            "illegal base64 data at input byte 55",
        ),
        ("", "unexpected end of JSON input"),
        ("abc", "invalid character 'i' looking for beginning of value"),
        (b64(b"x"), "invalid character 'x' looking for beginning of value"),
        (b64(b"{"), "unexpected end of JSON input"),
        (b64(b"{}x"), "invalid character 'x' after top-level value"),
        ("bm90LWpzb24", "invalid character 'o' in literal null (expecting 'u')"),  # not-json
        (b64(b'{"v" "x"}'), "invalid character '\"' after object key"),
        (
            b64(b'{"v":"meta.k8s.io/v1","rv":0,"start":"a"}'),
            "incorrect encoded start resourceVersion (version meta.k8s.io/v1)",
        ),
        (
            b64(b'{"v":"meta.k8s.io/v1","rv":5,"start":""}'),
            "encoded start key empty (version meta.k8s.io/v1)",
        ),
        (
            b64(b'{"v":"meta.k8s.io/v2","rv":5,"start":"a"}'),
            "server does not recognize this encoded version meta.k8s.io/v2",
        ),
        (b64(b'{"rv":5,"start":"a"}'), "server does not recognize this encoded version "),
        (b64(b"null"), "server does not recognize this encoded version "),
        (b64(b"[]"), "json: cannot unmarshal array into Go value of type storage.continueToken"),
        (b64(b'"x"'), "json: cannot unmarshal string into Go value of type storage.continueToken"),
        (
            b64(b'{"v":"meta.k8s.io/v1","rv":"5","start":"a"}'),
            "json: cannot unmarshal string into Go struct field continueToken.rv of type int64",
        ),
        (
            b64(b'{"v":"meta.k8s.io/v1","rv":1.5,"start":"a"}'),
            "json: cannot unmarshal number 1.5 into Go struct field continueToken.rv of type int64",
        ),
        (
            b64(b'{"v":"meta.k8s.io/v1","rv":5,"start":5}'),
            "json: cannot unmarshal number into Go struct field continueToken.start of type string",
        ),
        # path traversal and unclean keys are refused
        (b64(b'{"v":"meta.k8s.io/v1","rv":5,"start":"../x"}'), "../x"),
        (b64(b'{"v":"meta.k8s.io/v1","rv":5,"start":"a//b"}'), "a//b"),
        (b64(b'{"v":"meta.k8s.io/v1","rv":5,"start":"a/"}'), "a/"),
    ],
)
def test_decode_errors(token: str, error: str) -> None:
    with pytest.raises(InvalidContinueToken) as info:
        ContinueToken.decode(token)
    assert str(info.value) == f"continue key is not valid: {error}"
    status = info.value.to_status().to_payload()
    assert status["code"] == 400
    assert status.get("reason") == "BadRequest"
    assert status.get("message") == f"invalid continue token: continue key is not valid: {error}"


@pytest.mark.parametrize(
    ("start", "rv", "token"),
    [
        (
            "ns/name\x00",
            5,
            "eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6NSwic3RhcnQiOiJucy9uYW1lXHUwMDAwIn0",
        ),
        (
            "a<b>&c",
            7,
            "eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6Nywic3RhcnQiOiJhXHUwMDNjYlx1MDAzZVx1MDAyNmMifQ",
        ),
        ("x", -1, "eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6LTEsInN0YXJ0IjoieCJ9"),
    ],
)
def test_encode_matches_apiserver(start: str, rv: int, token: str) -> None:
    assert ContinueToken(resource_version=rv, start_key=start).encode() == token
    assert ContinueToken.decode(token) == ContinueToken(resource_version=rv, start_key=start)
