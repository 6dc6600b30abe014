"""The controller's status page (``/``) and its read-only JSON (``/api/v1/overview``).

Mount with :func:`register`, or ``ctl.apps.append(for_controller(ctl, idle=tracker))`` on a
:class:`controller.app.Controller`. Everything is shipped in the package (no CDN).
"""

from gpuhealth.controller.status_page.page import (
    OVERVIEW_PATH,
    StatusPage,
    for_controller,
    register,
)

__all__ = ["OVERVIEW_PATH", "StatusPage", "for_controller", "register"]
