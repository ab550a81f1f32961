"""Salt's own log records, as the test kit's scripts show them: on stderr,
``salt: LEVEL logger: message``, through one handler on the root logger.
(``salt_driver.py`` keeps its own set-up: it also lists the records.)"""

import logging
import sys


class Stderr(logging.Handler):
    """Writes each record on stderr as ``salt: LEVEL logger: message``; a
    record whose message cannot be formatted is dropped."""

    def emit(self, record):
        msg = message(record)
        if msg is not None:
            sys.stderr.write(f"salt: {record.levelname} {record.name}: {msg}\n")


def message(record):
    """The record's message, or None when it cannot be formatted."""
    try:
        return record.getMessage()
    except Exception:  # pylint: disable=broad-except
        return None


def only_handler(handler, level):
    """Makes ``handler`` the root logger's one handler, at ``level``."""
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(level)
