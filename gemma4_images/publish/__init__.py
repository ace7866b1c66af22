"""What leaves the machine and what proves it: push with digests, SBOM, provenance, signatures and
attachments, offline verification, and model images."""
