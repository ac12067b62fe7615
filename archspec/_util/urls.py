"""Storage URLs in messages: the password a user gave never printed (stdlib only, so the command line's first line,
before torch and Optuna are imported, can name a storage)."""

from __future__ import annotations

import re

__all__ = ["hide_password"]

_PASSWORD = re.compile(r"(?P<user>://[^:/?#@\s]*:)[^/\s]*@")  # scheme://user:PASSWORD@host


def hide_password(text: str) -> str:
    """``text`` with the password of every storage URL in it (``postgresql://user:PASSWORD@host/db``) written
    ``***``, as SQLAlchemy's ``URL.render_as_string(hide_password=True)`` writes it: what a message may print of a
    URL the user gave, or of a driver's error that quotes it.  Raises nothing."""
    return _PASSWORD.sub(r"\g<user>***@", text)
