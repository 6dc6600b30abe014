"""``gpuhealth-controller cleanup``: what it removes (pure) and the command."""
