"""`make reliability`: the project's own reliability figures, measured against real processes on loopback."""
