"""The Docker engine and what it makes: registry-free bases, wheelhouses, target images, base pins
(the registry API), and the probe that looks inside an image without serving it."""
