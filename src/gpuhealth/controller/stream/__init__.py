"""The controller's side of the stream: authentication, per-connection state, the handler."""
