"""qeval's version, in a module of its own: the resume keys read it from the ground floor."""

__version__ = "0.1.0"
