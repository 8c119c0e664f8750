"""The JSON nesting-depth gauge: exact at the limit, blind to brackets inside strings, the same whatever the
chunking and the encoding."""

from __future__ import annotations

import itertools
import json
import random
from typing import Any

import pytest

from bastion.middleware._json_depth import JsonDepthGauge


def within(data: bytes, limit: int, cuts: tuple[int, ...] = ()) -> bool:
    """Whether ``data``, fed in the pieces ``cuts`` makes of it, stays within ``limit``."""
    gauge = JsonDepthGauge(limit)
    edges = [0, *cuts, len(data)]
    return all(gauge.feed(data[start:end], last=end == len(data)) for start, end in itertools.pairwise(edges))


def depth(value: Any) -> int:
    if isinstance(value, list):
        return 1 + max(map(depth, value), default=0)
    if isinstance(value, dict):
        return 1 + max(map(depth, value.values()), default=0)
    return 0


def nested(levels: int) -> bytes:
    return b"[" * levels + b"]" * levels


@pytest.mark.parametrize("limit", [1, 2, 64, 200])
def test_the_limit_itself_passes_and_one_more_level_does_not(limit: int) -> None:
    assert within(nested(limit), limit)
    assert not within(nested(limit + 1), limit)
    assert within(b'{"a":' * limit + b"1" + b"}" * limit, limit)
    assert not within(b'{"a":' * (limit + 1) + b"1" + b"}" * (limit + 1), limit)


def test_many_shallow_containers_pass() -> None:
    """More ``[`` and ``{`` bytes than the limit, none deep: the exact scan runs and agrees."""
    body = json.dumps([{"id": n, "tags": ["a", "b"], "meta": {"k": [1, 2]}} for n in range(1000)]).encode()
    assert depth(json.loads(body)) == 4
    assert within(body, 4)
    assert not within(body, 3)


@pytest.mark.parametrize(
    "text",
    [
        pytest.param('["[[[[[[[[[[", [["]]]]"]]]', id="brackets-in-strings"),
        pytest.param('[["\\"[[[[[[[["], ["\\\\"], [[1]]]', id="escaped-quote-and-backslash"),
        pytest.param('[{"\\u005b[[[[": "{{{{{"}, [[]]]', id="unicode-escape"),
        pytest.param('[["é[[[[[[", "嬀{{{{{{"], [[]]]', id="multibyte"),
    ],
)
def test_brackets_inside_strings_do_not_count(text: str) -> None:
    data = text.encode()
    assert depth(json.loads(data)) == 3
    assert within(data, 3)
    assert not within(data, 2)


def test_every_split_of_a_body_gives_the_same_answer() -> None:
    data = b'[["\\\\\\"[[", ["{\\\\"], {"k": [["]"]]}], [[1]]]'
    assert depth(json.loads(data)) == 5
    for first in range(len(data) + 1):
        for second in range(first, len(data) + 1):
            assert within(data, 5, (first, second))
            assert not within(data, 4, (first, second)), (first, second)


@pytest.mark.parametrize("encoding", ["utf-8-sig", "utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-32-le"])
def test_utf16_and_utf32_bodies_are_measured_once_complete(encoding: str) -> None:
    """``json.loads`` reads them (RFC 8259 8.1 allows only UTF-8 between systems); U+5B00 has a ``[`` byte."""
    data = json.dumps([["嬀[[[[", {"k": ["嬀"]}], [[1]]], ensure_ascii=False).encode(encoding)
    assert within(data, 4, (3, 17))
    assert not within(data, 3, (3, 17))


def test_random_documents_in_random_chunks_match_the_parser() -> None:
    rng = random.Random(27)
    pieces = ["[", "]", "{", "}", '"', "\\", "é", "嬀", "x", "\n"]

    def document(levels: int) -> Any:
        if levels <= 0 or rng.random() < 0.2:
            return rng.choice([1, None, True, "".join(rng.choices(pieces, k=rng.randint(0, 5)))])
        if rng.random() < 0.5:
            return [document(levels - 1) for _ in range(rng.randint(0, 3))]
        keys = ["".join(rng.choices(pieces, k=rng.randint(0, 3))) for _ in range(rng.randint(0, 2))]
        return {key: document(levels - 1) for key in keys}

    for _ in range(2000):
        value = document(rng.randint(0, 12))
        data = json.dumps(value, ensure_ascii=rng.random() < 0.5).encode()
        limit = rng.randint(1, 16)
        cuts = tuple(sorted(rng.randint(0, len(data)) for _ in range(rng.randint(0, 6))))
        assert within(data, limit, cuts) == (depth(value) <= limit), (data, limit, cuts)


def test_bytes_that_are_not_json_get_an_answer_not_an_exception() -> None:
    rng = random.Random(5)
    for _ in range(2000):
        data = bytes(rng.choices(b'[]{}"\\ \x00\xff', k=rng.randint(0, 40)))
        cuts = tuple(sorted(rng.randint(0, len(data)) for _ in range(3)))
        within(data, rng.randint(1, 4), cuts)


def test_an_unterminated_string_after_the_count_is_linear_not_quadratic() -> None:
    """Escaped quotes to the end of a 1 MB body: one pass (a regex retried at each quote would not finish)."""
    assert within(b"[" * 65 + b"]" * 65, 65)
    assert within(b"[" * 10 + b'"' + b'\\"' * 500_000, 64)
