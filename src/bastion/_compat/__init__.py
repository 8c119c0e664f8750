"""The one wall for borrowed internals: every private name of a third-party library that Bastion relies on.

One module per library (``grpclib``, ``h2``, ``uvicorn``, ...). Each names what it assumes, and
``tests/bastion/compat/test_<library>.py`` checks those assumptions against the installed version and names the
versions they were verified on. Code outside this package uses only public APIs of those libraries.
"""
