"""What to build, read from targets.yaml, the recipes, the fixes pack and vLLM's source release.
No Docker engine and no network here: everything is a pure reading of files in the checkout."""
