"""The remediation loop: quarantine -> drain -> GPU reset or reboot -> validate -> return.

One ``GPURemediation`` custom resource per node fault (an *episode*) holds everything the
loop knows; the controller keeps nothing only in memory, so a restart or a leader change
resumes every episode from its status. The decisions are pure functions (``fault``,
``drain``, ``gang``, ``safety``, ``machine`` and one module per phase); ``runner`` does the
I/O through the ports in ``observe`` (Kubernetes adapters in ``controller/kube``, the agent
stream for orders); ``status`` holds every status change a step makes.
docs/remediation.md explains the loop for operators.
"""
