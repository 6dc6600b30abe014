"""The circuit breaker: the one gate every hard write asks, its state kept in a ConfigMap while
this replica leads, and the operator's ``breaker status|reset`` command."""
