"""Local Kubernetes control plane for tests and the demo (test infrastructure, not product code)."""
