"""The controller's status page (``/``) and its read-only JSON (``/api/v1/overview``).

Build a :class:`StatusPage` and mount it with :meth:`StatusPage.add_routes` (the controller
does so in :mod:`gpuhealth.controller.compose`), or use :func:`register`. Everything is shipped in
the package (no CDN).
"""

from gpuhealth.controller.status_page.page import (
    OVERVIEW_PATH,
    StatusPage,
    register,
)

__all__ = ["OVERVIEW_PATH", "StatusPage", "register"]
