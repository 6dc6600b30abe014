"""The agent's side of the stream: durable outbox, token file, backoff, WebSocket client."""
