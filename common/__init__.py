"""Runtime pieces shared by the agent and the controller: clock, logging, tasks, errors, config."""

if not __name__.startswith("gpuhealth."):  # the repository root on sys.path: a second copy
    raise ImportError(
        f"import gpuhealth.{__name__}, not {__name__} (docs/architecture.md, Packaging)"
    )
