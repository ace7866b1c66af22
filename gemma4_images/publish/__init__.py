"""What leaves the machine and what proves it: push with digests, SBOM, provenance, cosign
signatures and attestations, their verification, and model images."""
