"""The one wall for borrowed internals: every private name of a third-party library that Bastion relies on.

One module per library (``fastapi``, ``grpclib``, ``hpack``, ``starlette``, ``uvicorn``; MailRelay's aiosmtpd
internals are in ``mailrelay/smtp/_compat.py``). Each lists in its docstring what it assumes, declares
``VERIFIED`` (the version last checked) and ``PRIVATE_NAMES``, and says at start-up whether the installed version
has what it needs (``supported()`` for a fast path that falls back to the public one, ``check()`` for a security
limit: start-up refuses in one line). ``tests/bastion/compat/test_<library>.py`` checks the assumptions against the
installed version; ``tests/bastion/compat/test_wall.py`` fails when a private name of those libraries is used
anywhere else in src. Code outside this package uses only public APIs of those libraries.
"""
