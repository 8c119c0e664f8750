"""`mailrelay dead-letters list|show|replay`: the dead letters of a queue-mode stream, filtered by route, error and
age, shown or queued again with their original delivery id.

Exit codes: 0 done, 1 NATS unavailable or no such dead letter, 2 a usage or configuration error (one line each).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TYPE_CHECKING, NoReturn

from bastion_core import ConfigError
from mailrelay import _extras as extras
from mailrelay._config import PREFIX, mask_nats_url, read_environment
from mailrelay._config.converters import parse_nats_urls, parse_stream_name
from mailrelay._dead_letters import DeadLetter, LetterFilter, parse_duration, shown_age
from mailrelay._errors import QueueUnavailable

if TYPE_CHECKING:  # nats-py (the queue extra): imported once the extra is checked
    from mailrelay._dead_letter_store import DeadLetterStore

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
DEFAULT_STREAM = "MAILRELAY"
DEFAULT_LIST_LIMIT = 100
SHOWN_ERROR_CHARS = 80
PROGRAM = "mailrelay dead-letters"

Out = Callable[[str], None]


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        """One line instead of argparse's usage block."""
        print(f"{PROGRAM}: error: {message} (see {PROGRAM} --help)", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)


def _duration(raw: str) -> float:
    try:
        return parse_duration(raw)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def parser() -> argparse.ArgumentParser:
    common = _Parser(add_help=False)
    common.add_argument("--nats-url", help=f"the NATS server(s) (default: {PREFIX}NATS_URL)")
    common.add_argument("--stream", help=f"the relays' stream (default: {PREFIX}QUEUE_STREAM, else {DEFAULT_STREAM})")
    filters = _Parser(add_help=False)
    filters.add_argument("--route", help="only letters of this route (`default` without named routes)")
    filters.add_argument("--error", help="only letters whose error contains this text (case-insensitive)")
    filters.add_argument("--older-than", type=_duration, metavar="AGE", help="dead-lettered at least AGE ago (2h)")
    filters.add_argument("--newer-than", type=_duration, metavar="AGE", help="dead-lettered less than AGE ago (30m)")
    top = _Parser(prog=PROGRAM, description="Inspect and replay the dead letters of a queue-mode relay's stream.")
    commands = top.add_subparsers(dest="command", required=True, parser_class=_Parser)
    listing = commands.add_parser("list", parents=[common, filters], help="one line per dead letter, oldest first")
    listing.add_argument("--limit", type=int, default=DEFAULT_LIST_LIMIT, help="at most this many (default 100)")
    listing.add_argument("--json", action="store_true", help="one JSON object per line")
    show = commands.add_parser("show", parents=[common], help="one dead letter with its payload, as JSON")
    show.add_argument("reference", metavar="SEQ|DELIVERY_ID")
    replay = commands.add_parser(
        "replay", parents=[common, filters], help="queue letters again (same delivery id), then delete them"
    )
    replay.add_argument("references", nargs="*", metavar="SEQ|DELIVERY_ID")
    replay.add_argument("--all", action="store_true", help="every letter the filters select")
    replay.add_argument("--dry-run", action="store_true", help="name the letters, change nothing")
    return top


def main(argv: Sequence[str]) -> int:
    """Run one dead-letters command; the exit code."""
    try:
        args = _arguments(argv)
    except SystemExit as exc:  # --help (0) or a usage error (2, its line printed)
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    try:
        servers, stream = _connection(args.nats_url, args.stream)
        extras.DEAD_LETTERS.require()
    except ConfigError as exc:
        print(f"mailrelay: configuration error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        return asyncio.run(_run(args, servers, stream, out=print))
    except QueueUnavailable as exc:
        print(f"mailrelay: error: NATS at {mask_nats_url(','.join(servers))}: {exc.reason}", file=sys.stderr)
        return EXIT_FAILED


def _arguments(argv: Sequence[str]) -> argparse.Namespace:
    top = parser()
    args = top.parse_args(list(argv))
    if args.command == "replay" and bool(args.references) == bool(args.all):
        top.error("name dead letters (SEQ or DELIVERY_ID) or give --all, not both")
    if args.command == "list" and args.limit < 1:
        top.error(f"argument --limit: expected a positive integer, got {args.limit}")
    return args


def _connection(url: str | None, stream: str | None) -> tuple[list[str], str]:
    """The NATS servers and stream: the options, else the relay's own variables (environment over ./.env)."""
    environ = read_environment()
    variables = ((url, PREFIX + "NATS_URL", "--nats-url"), (stream, PREFIX + "QUEUE_STREAM", "--stream"))
    values: list[str] = []
    for (given, variable, option), convert in zip(variables, (parse_nats_urls, parse_stream_name), strict=True):
        raw = given if given is not None else environ.get(variable, "").strip()
        name = option if given is not None else variable
        if not raw and variable.endswith("STREAM"):
            raw = DEFAULT_STREAM
        if not raw:
            raise ConfigError.invalid(variable, None, f"a NATS URL like nats://127.0.0.1:4222 (or {option})")
        try:
            values.append(convert(raw))
        except ValueError as exc:
            shown = mask_nats_url(raw) if variable.endswith("NATS_URL") else raw
            raise ConfigError.invalid(name, shown, str(exc)) from None
    return values[0].split(","), values[1]


async def _run(args: argparse.Namespace, servers: list[str], stream: str, *, out: Out) -> int:
    from mailrelay._dead_letter_store import DeadLetterStore  # nats-py: the queue extra

    async with DeadLetterStore(servers=servers, stream=stream) as store:
        if args.command == "show":
            letter = await store.find(args.reference)
            if letter is None:
                print(f"mailrelay: error: no dead letter {args.reference!r} in stream {stream}", file=sys.stderr)
                return EXIT_FAILED
            out(json.dumps(letter.detail(), indent=2, ensure_ascii=False))
            return EXIT_OK
        selected = _filter(args)
        if args.command == "list":
            return await _list(store.letters(), selected, limit=args.limit, as_json=args.json, out=out)
        return await _replay(store, args, selected, out=out)


def _filter(args: argparse.Namespace) -> LetterFilter:
    return LetterFilter(route=args.route, error=args.error, older_than=args.older_than, newer_than=args.newer_than)


async def _list(
    letters: AsyncIterator[DeadLetter], selected: LetterFilter, *, limit: int, as_json: bool, out: Out
) -> int:
    now, shown = time.time(), 0
    if not as_json:
        out(f"{'SEQ':>8}  {'DELIVERY ID':<32}  {'ROUTE':<16}  {'AGE':>5}  {'TRIES':>5}  ERROR")
    async for letter in letters:
        if not selected.matches(letter, now=now):
            continue
        out(json.dumps(letter.summary(), ensure_ascii=False) if as_json else _row(letter, now))
        shown += 1
        if shown >= limit:
            break
    if not as_json:
        reached = f" (--limit {limit} reached)" if shown >= limit else ""
        out(f"{shown} dead letter{'' if shown == 1 else 's'}{reached}")
    return EXIT_OK


def _row(letter: DeadLetter, now: float) -> str:
    attempts = "" if letter.attempts is None else str(letter.attempts)
    return (
        f"{letter.sequence:>8}  {_printable(letter.delivery_id, 32):<32}  {_printable(letter.route, 16):<16}  "
        f"{shown_age(now - letter.dead_lettered_at):>5}  {attempts:>5}  {_printable(letter.error, SHOWN_ERROR_CHARS)}"
    )


def _printable(text: str, limit: int) -> str:
    """Header text as a terminal line may show it: control characters escaped, at most `limit` characters."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)[:limit]


async def _replay(store: DeadLetterStore, args: argparse.Namespace, selected: LetterFilter, *, out: Out) -> int:
    """The named letters (all found before any is replayed), or with --all each selected one as it is read."""
    verb, count = "would replay" if args.dry_run else "replayed", 0
    for_all = _selected(store.letters(), selected, now=time.time())
    named = [] if args.all else [await store.find(reference) for reference in args.references]
    if None in named:
        missing = args.references[named.index(None)]
        print(f"mailrelay: error: no dead letter {missing!r} in stream {store.stream}", file=sys.stderr)
        return EXIT_FAILED
    async for letter in for_all if args.all else _each([n for n in named if n is not None]):
        if not args.dry_run:
            await store.replay(letter)
        out(f"{verb} {letter.sequence} {_printable(letter.delivery_id, 64)} (route {_printable(letter.route, 64)})")
        count += 1
    out(f"{count} dead letter{'' if count == 1 else 's'} {verb}")
    return EXIT_OK


async def _selected(
    letters: AsyncIterator[DeadLetter], selected: LetterFilter, *, now: float
) -> AsyncIterator[DeadLetter]:
    async for letter in letters:
        if selected.matches(letter, now=now):
            yield letter


async def _each(letters: list[DeadLetter]) -> AsyncIterator[DeadLetter]:
    for letter in letters:
        yield letter
