"""The controller's Kubernetes adapter: the only package that imports kubernetes_asyncio."""
