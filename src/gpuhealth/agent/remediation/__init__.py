"""The agent's remediation executors: what the controller orders over the stream.

The agent holds no Kubernetes permission: it resets a GPU (only when no process uses it),
reboots the node through a pluggable executor, and validates the GPUs, then reports
through the outbox. :class:`~gpuhealth.agent.remediation.order_handler.OrderHandler` receives the
orders, executes each order id at most once and remembers results on disk. See
docs/remediation.md.
"""
