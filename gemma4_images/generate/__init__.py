"""Text made from the spec: Dockerfile.<family>, image/recipes/, FIXES.md, docker-bake.hcl and the
Kubernetes manifests. Committed outputs are checked for drift (`build.py render --check`)."""
