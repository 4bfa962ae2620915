"""Model families. Each family is a sibling package driven by the training code through
:mod:`rank4jax.models.family`."""
