"""The taint controller's core: pure policy (health -> desired Node facts), the pure node plan
(desired against the Node as the API server has it) and the level-triggered reconciler."""
