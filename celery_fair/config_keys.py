"""Which keys of ``app.conf`` are celery_fair settings, and refusing unknown ones (a
misspelt setting would otherwise be silently ignored); the error of a bad value, and the
value checks the store shares with the settings (``check_table_prefix``)."""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from typing import Any

from .errors import ConfigurationError

#: Settings celery_fair does not read yet -> why; setting one is an error saying so (an
#: ignored setting would look as if it worked).
NOT_SUPPORTED_YET: dict[str, str] = {}


def invalid_setting(name: str, value: Any, expected: str) -> ConfigurationError:
    """The error of a setting with a bad value: its name, the value, what is expected."""
    return ConfigurationError(f"setting {name}={value!r} is invalid: expected {expected}")


def reject_unknown(conf: Mapping[str, Any], namespace: str | None,
                   known: Mapping[str, Any]) -> None:
    """Raise ConfigurationError for a ``fair_*`` key of ``conf`` not in ``known``."""
    prefix = namespace.rstrip("_") + "_" if namespace else ""
    for key in map(str, list(conf.keys())):
        read_as = _fair_key(key, prefix)
        if read_as is None or read_as[1] in known:
            continue
        written_prefix, name = read_as
        if name in NOT_SUPPORTED_YET:
            raise ConfigurationError(f"setting {key}={conf[key]!r} is not supported yet: "
                                     f"{NOT_SUPPORTED_YET[name]}")
        hint = ""
        for close in difflib.get_close_matches(name, list(known), n=1):
            # spelled the way the user spells settings (CELERY_FAIR_... in Django)
            hint = f"; did you mean {written_prefix + _case_like(key, close)!r}?"
        raise ConfigurationError(f"unknown celery_fair setting {key!r}{hint}")


def _case_like(key: str, name: str) -> str:
    return name.upper() if key.isupper() else name


def _fair_key(key: str, prefix: str) -> tuple[str, str] | None:
    """(prefix as written, ``fair_*`` name) of a key celery_fair would read, else None.

    Celery maps a namespace (``config_from_object("django.conf:settings",
    namespace="CELERY")``) for every key it is asked for, so ``CELERY_FAIR_X`` reads as
    ``fair_x``. With a namespace, other settings of the source (Django's own ``FAIR_*``)
    are not Celery's; only a lowercase ``fair_x`` set on ``app.conf`` is read bare.
    """
    if prefix and key.upper().startswith(prefix.upper() + "FAIR_"):
        return key[:len(prefix)], key[len(prefix):].lower()
    if key.lower().startswith("fair_") and (not prefix or key.islower()):
        return "", key.lower()
    return None


def check_table_prefix(value: Any, name: str = "fair_store_table_prefix") -> str:
    """A prefix of SQL table names: it is written into DDL, so only a safe identifier."""
    if not isinstance(value, str) or not _TABLE_PREFIX.fullmatch(value):
        raise invalid_setting(name, value, "letters, digits and underscores, starting with "
                                           "a letter, at most 20 characters (like 'fair_')")
    return value


_TABLE_PREFIX = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,19}")
