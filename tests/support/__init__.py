"""Shared test support: protocol message builders, fleet feeding, polling with a deadline.

Importable from unit and integration tests as ``tests.support.<module>``; one copy of each
helper, so that tests read the same everywhere.
"""
