"""Leadership: Lease-based leader election and the work only the leader runs."""
