"""The simulator source: scripted GPUs and faults from a scenario (the demo, tests, benches)."""
