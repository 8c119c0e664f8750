"""User callables in either shape: an ``async def`` is awaited, a ``def`` runs in the thread pool (as FastAPI runs it).

Every callable a :class:`~bastion.Service` takes (readiness checks, start-up and shutdown hooks, resource
extractors, fallbacks, exception handlers, broker handlers) is checked here once, at registration: a callable
that cannot take the arguments it will be given is refused with one line, not at its first call.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.concurrency import run_in_threadpool

from bastion.errors import ConfigError

AsyncCallable = Callable[..., Awaitable[Any]]


def is_async(func: object) -> bool:
    """Whether calling ``func`` returns a coroutine: an ``async def``, a partial of one, or an object whose
    ``__call__`` is one."""
    while isinstance(func, functools.partial):
        func = func.func
    return inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(type(func).__call__)


def check_shape(func: object, *, what: str, arguments: int | None) -> None:
    """Raise ConfigError (one line) unless ``func`` is a function or coroutine function taking ``arguments``
    positional arguments (``None``: its caller reads the signature itself). A generator cannot be awaited or
    return a value, so it is refused too."""
    if not callable(func):
        raise ConfigError(f"{what}: expected a function, got {type(func).__name__}")
    name = getattr(func, "__name__", type(func).__name__)
    if inspect.isgeneratorfunction(func) or inspect.isasyncgenfunction(func):
        raise ConfigError(f"{what}: {name} is a generator; expected a def or async def function")
    if arguments is None:
        return
    try:
        signature = inspect.signature(func)
    except (TypeError, ValueError):
        return  # a builtin without a readable signature: it will tell at its call
    try:
        signature.bind(*(None,) * arguments)
    except TypeError:
        plural = "" if arguments == 1 else "s"
        raise ConfigError(
            f"{what}: {name}{signature} cannot be called with {arguments} positional argument{plural}"
        ) from None


def as_async(func: Callable[..., Any], *, what: str, arguments: int | None) -> AsyncCallable:
    """``func`` checked (:func:`check_shape`) and callable with ``await``: an ``async def`` as it is, a ``def``
    run in the thread pool (an awaitable it returns is awaited too)."""
    check_shape(func, what=what, arguments=arguments)
    if is_async(func):
        return func

    @functools.wraps(func)
    async def in_thread(*args: Any, **kwargs: Any) -> Any:
        result = await run_in_threadpool(func, *args, **kwargs)
        if inspect.isawaitable(result):
            result = await result
        return result

    return in_thread
