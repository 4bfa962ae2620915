"""Checkpoints: orbax storage of a run (``storage``) and the fallback from damaged ones (``damage``)."""
