"""The controller's one HTTP server: routes, caller authentication and authorization, slow-client
bounds, TLS, the ``/api/v1`` JSON API and the ``http:`` settings."""
