"""Benchmark records: a JSON list each program appends its records to."""

import json

__all__ = ["append"]


def append(path, record):
    """Add ``record`` to the JSON list in ``path`` (a new list if there is no such file)."""
    try:
        with open(path) as f:
            records = json.load(f)
    except FileNotFoundError:
        records = []
    with open(path, "w") as f:
        json.dump(records + [record], f, indent=1)
