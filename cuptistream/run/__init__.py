"""A probe and a collector put together: around a command (``program``: ``cuptistream run``, every
Python process of the command probed, this process collecting) or around a block of this process
(``session``: ``cuptistream.session``, the library API)."""
