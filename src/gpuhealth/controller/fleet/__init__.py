"""The fleet: every node's GPUs and health as the agents report them, and the one model people
read it through (``/api/v1/fleet``, the status page, the gauges), kept ready in a cache."""
