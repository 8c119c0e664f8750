"""The service of the README's "Writing a service" (``app.py``), with its configuration and Cedar policies."""
