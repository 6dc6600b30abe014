"""The cluster half of gpuhealth: stream server, fleet model, policy, reconciler, placement."""

if not __name__.startswith("gpuhealth."):  # the repository root on sys.path: a second copy
    raise ImportError(
        f"import gpuhealth.{__name__}, not {__name__} (docs/architecture.md, Packaging)"
    )


__version__ = "0.1.0"
