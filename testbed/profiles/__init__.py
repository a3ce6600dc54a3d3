"""Impairment profiles: the typed model (model.py) and reading files with overrides
(loading.py)."""

from testbed.profiles.loading import ProfileError, available, load
from testbed.profiles.model import Impairment, Profile

__all__ = ["Impairment", "Profile", "ProfileError", "available", "load"]
