"""The controller's status page (``/``) and its read-only JSON (``/api/v1/overview``).

Mount with :func:`register`; everything is shipped in the package (no CDN)."""

from controller.web.routes import OVERVIEW_PATH, StatusPage, register

__all__ = ["OVERVIEW_PATH", "StatusPage", "register"]
