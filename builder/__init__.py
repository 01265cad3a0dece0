"""verl-env: turn one reviewed compatibility matrix into verified verl training environments."""

__version__ = "0.1.0"
