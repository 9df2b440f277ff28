"""Integrations, each opt-in (import it where you need it): web frameworks (``django``,
``flask``), ``flower`` and ``pytest`` fixtures."""
